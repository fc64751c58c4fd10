"""`draftline bench selfdraft`: self-speculation (engine.selfdraft) against plain decoding and the
n-gram drafter on the default model: step cost, agreement, acceptance and end-to-end speed."""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import threading
import time
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:  # torch and the models load when the bench runs, not when the CLI parses
    from engine.lean import LeanLM
    from engine.selfdraft import SelfDraftLM


def _step_costs(target: LeanLM, drafts: dict[str, SelfDraftLM], context: list[int], steps: int) -> dict[str, dict]:
    """One decode step's time at `len(context)` tokens of context: each draft's median as a fraction of
    the target's, from per-round ratios (every round runs all of them, in a rotating order)."""
    lms = {"target": target, **drafts}
    for lm in lms.values():
        lm.reset()
        lm.forward(context, keep_logits=1)
    n = len(context)
    times: dict[str, list[float]] = {name: [] for name in lms}
    names = list(lms)
    for r in range(steps + 3):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            lm = lms[name]
            t0 = time.perf_counter()
            lm.forward([context[(r * 7) % n]], keep_logits=1)
            dt = time.perf_counter() - t0
            lm.truncate(n)
            if r >= 3:  # warm-up rounds
                times[name].append(dt)
    out = {}
    for name in drafts:
        ratios = [d / t for d, t in zip(times[name], times["target"])]
        out[name] = {"ms": 1000 * statistics.median(times[name]), "fraction": statistics.median(ratios)}
    out["target"] = {"ms": 1000 * statistics.median(times["target"]), "fraction": 1.0}
    return out


def _eagle_agreement(lm, target: LeanLM, prompt: list[int], answer: list[int]) -> tuple[int, int]:
    """_agreement for an EAGLE draft: pair p (the target's feature at p, token p + 1) guesses token
    p + 2; the target's features along prompt + answer come from its own forwards (decode-sized pieces)."""
    from engine.lean import INT8_MAX_ROWS

    if len(answer) < 2:
        return 0, 0
    seq = list(prompt) + list(answer)
    target.keep_hidden()
    target.reset()
    target.forward(prompt, keep_logits=1)
    for s in range(0, len(answer) - 1, INT8_MAX_ROWS):
        target.forward(answer[:-1][s : s + INT8_MAX_ROWS], keep_logits=1)
    n = len(seq) - 2  # pairs 0 .. n - 1
    lm.reset()
    logits = lm.forward_pairs(seq[1 : n + 1], target.hidden[:n], keep=len(answer) - 1)
    preds = logits.argmax(-1).tolist()  # pairs P - 1 .. n - 1 guess answer[1:]
    target.reset()
    return sum(int(p == a) for p, a in zip(preds, answer[1:])), len(answer) - 1


def _agreement(lm: SelfDraftLM, prompt: list[int], answer: list[int]) -> tuple[int, int]:
    """(matches, positions): how often the draft's argmax after prompt + answer[:j] is answer[j]
    (the target's greedy token), j >= 1, fed in pieces short enough for the decode-step kernels."""
    from engine.lean import INT8_MAX_ROWS

    if len(answer) < 2:
        return 0, 0
    lm.reset()
    lm.forward(prompt, keep_logits=1)
    preds: list[int] = []
    feed = answer[:-1]
    for s in range(0, len(feed), INT8_MAX_ROWS):
        preds += lm.forward(feed[s : s + INT8_MAX_ROWS]).argmax(-1).tolist()
    return sum(int(p == a) for p, a in zip(preds, answer[1:])), len(answer) - 1


def measure(target: str = "", layers: Sequence[int] = (4, 8, 12), heads: Sequence[int | None] = (None, 4096),
            prompts: int = 8, max_new: int = 64, prompt_chars: int = 1500, steps: int = 60, seed: int = 0,
            confidence: float | None = None, probe: Sequence[int] = (16, 20, 24, 28), out=sys.stdout,
            eagle: str | None = None) -> dict:
    """Self drafts of `layers` x `heads` (None: the full head) against plain decoding and the n-gram drafter.

    Per draft: one draft step's cost as a fraction of a target step (median over `steps` at the
    first prompt's context), its agreement with the target's greedy tokens, and over `prompts`
    held-out prompts (engine.bench.engine.held_out_prompts: cut at the start of an indented line)
    with up to `max_new` tokens: acceptance (drafted tokens the target kept), tokens per verify
    step, and speedup vs plain and vs n-gram (the median over prompts of the time ratio, over the
    same tokens; modes interleaved, a rotating order per prompt, after one untimed warm-up round).
    Every mode's output must equal plain's. `confidence`: the drafter's p_min (None: SpecConfig's).
    `probe`: further depths whose agreement alone is measured (full head; no end-to-end run).
    `eagle`: also an EAGLE draft (engine.eagle; "eagle" = the shipped one, or a file), alone ("eagle")
    and behind the n-gram copy ("eagle+ngram", the hybrid), both three tokens at a time; its step is
    one pair of its layer.
    """
    import torch

    from engine.bench.engine import held_out_prompts
    from engine.lean import LeanLM
    from engine.selfdraft import SelfDraftLM, head_ids, token_ranking
    from engine.bundled import resolve
    from engine.drafters import ModelDrafter
    from engine.engine import load_engine
    from engine.types import CompletionRequest, Limits, SpecConfig

    target_name, _, _ = resolve(target)
    engine = load_engine(target_name)
    lean = engine.target_lm
    if not isinstance(lean, LeanLM):
        raise ValueError(f"{target_name} does not run on the lean decoder")
    tok = engine.target.tokenizer
    ranking = token_ranking(tok) if any(heads) and layers else None
    p_min = SpecConfig().draft_confidence if confidence is None else confidence
    drafts: dict[str, SelfDraftLM] = {}
    for n in layers:
        for k in heads:
            ids = head_ids(tok, k, lean.lm_head.w.shape[0], ranking) if k else None
            drafts[f"self:{n}" + (f":{k}" if k else "")] = SelfDraftLM(lean, n, ids)
    probes = {f"self:{n}": SelfDraftLM(lean, n) for n in probe if f"self:{n}" not in drafts}
    eagle_lm = None
    if eagle:
        from engine import eagle as eagle_mod

        path = eagle_mod.parse_eagle_draft(eagle) or eagle_mod.parse_eagle_draft(f"eagle:{eagle}")
        tensors, ids, _ = eagle_mod.load(path)
        lean.keep_hidden()
        eagle_lm = eagle_mod.EagleLM(lean, tensors, ids)
    cut = held_out_prompts(prompts, prompt_chars, seed)
    requests = [CompletionRequest(prefix=prefix, suffix=suffix, path=path, uri=f"selfdraft://{i}",
                                  limits=Limits(max_tokens=max_new)) for i, (path, prefix, suffix) in enumerate(cut)]
    print(f"{target_name}: {len(lean.layers)} layers, {len(requests)} held-out prompts x {max_new} tokens, "
          f"{torch.get_num_threads()} threads, draft p_min {p_min}", file=out, flush=True)
    if ranking is not None:
        for k in sorted({k for k in heads if k}):
            covered = sum(ranking["counts"][:k]) / max(1, ranking["tokens"])
            print(f"head {k}: the top {k} ids cover {covered:.1%} of {ranking['tokens']:,} training-split tokens "
                  f"({ranking['source']})", file=out, flush=True)

    # 1. one draft step vs one target step at the first prompt's context
    context = engine.prompt_for(requests[0]).tokens
    # an EAGLE draft's plain forward reads the target's features at its positions (the target runs first)
    costs = _step_costs(lean, {**drafts, **({"eagle": eagle_lm} if eagle_lm else {})}, context, steps)
    if eagle_lm is not None:
        costs["eagle+ngram"] = costs["eagle"]
    print(f"step cost at {len(context)} tokens of context: target {costs['target']['ms']:.1f} ms (median)",
          file=out, flush=True)

    # 2. end to end, modes interleaved per prompt
    eagle_modes = ["eagle", "eagle+ngram"] if eagle_lm is not None else []
    modes = ["plain", "ngram", *drafts, *eagle_modes]
    specs = {"plain": SpecConfig(drafter="none"), "ngram": SpecConfig(drafter="ngram", schedule="adaptive")}

    def run(mode: str, request: CompletionRequest):
        engine.forget()
        drafter = None
        spec = specs.get(mode)
        if mode in drafts:
            drafts[mode].reset()  # every mode pays its own prefill, the draft's included
            drafter = ModelDrafter(drafts[mode], p_min=p_min)
            spec = SpecConfig(drafter="draft", schedule="adaptive", draft_confidence=p_min)
        elif mode in eagle_modes:
            from engine.drafters import HybridDrafter
            from engine.eagle import EagleDrafter

            eagle_lm.reset()
            drafter = EagleDrafter(lean, eagle_lm, p_min=0.0)
            if mode == "eagle+ngram":  # the engine sets the n-gram's min_n from the spec's ngram_min
                drafter = HybridDrafter(engine.ngram, drafter, 2)
            spec = SpecConfig(drafter="draft", schedule="fixed", gamma=3, draft_confidence=0.0, ngram_min=2)
        t0 = time.perf_counter()
        res = engine.complete(request, threading.Event(), spec, drafter=drafter)
        return res, time.perf_counter() - t0

    for mode in modes:  # warm-up: first-request costs (token healing tables, allocations) outside the timing
        run(mode, requests[-1])
    seconds = {m: 0.0 for m in modes}
    per_prompt: dict[str, list[float]] = {m: [] for m in modes}
    draft_s = {m: 0.0 for m in modes}
    proposed = {m: 0 for m in modes}
    accepted = {m: 0 for m in modes}
    verifies = {m: 0 for m in modes}
    identical = {m: True for m in modes}
    agree = {m: [0, 0] for m in (*drafts, *probes, *eagle_modes)}
    n_tokens = 0
    for i, request in enumerate(requests):
        order = modes[i % len(modes):] + modes[: i % len(modes)]
        results = {}
        for mode in order:
            res, elapsed = run(mode, request)
            seconds[mode] += elapsed
            per_prompt[mode].append(elapsed)
            results[mode] = res.tokens
            st = res.stats
            draft_s[mode] += st.draft_s
            proposed[mode] += sum(st.proposed)
            accepted[mode] += sum(st.accepted)
            verifies[mode] += len(st.proposed)
        n_tokens += len(results["plain"])
        for mode in modes:
            identical[mode] &= results[mode] == results["plain"]
        prompt_tokens = engine.last_prompt  # the healed prompt of the last mode: every mode's is the same
        for name, lm in (*drafts.items(), *probes.items()):
            m, n = _agreement(lm, prompt_tokens, list(results["plain"]))
            agree[name][0] += m
            agree[name][1] += n
        if eagle_lm is not None:
            m, n = _eagle_agreement(eagle_lm, lean, prompt_tokens, list(results["plain"]))
            for name in eagle_modes:
                agree[name][0] += m
                agree[name][1] += n
        times = " ".join(f"{m} {1000 * per_prompt[m][-1]:.0f}" for m in modes)
        print(f"  prompt {i + 1}/{len(requests)}: {len(prompt_tokens)} prompt tokens, {len(results['plain'])} new; "
              f"ms: {times}", file=out, flush=True)

    rows = []
    for mode in modes:
        rows.append({
            "mode": mode,
            "step_fraction": costs[mode]["fraction"] if mode in costs and mode != "target" else None,
            "agreement": agree[mode][0] / agree[mode][1] if mode in agree and agree[mode][1] else None,
            "acceptance": accepted[mode] / proposed[mode] if proposed[mode] else None,
            "tokens_per_verify": (accepted[mode] + verifies[mode]) / verifies[mode] if verifies[mode] else None,
            "draft_share": draft_s[mode] / seconds[mode] if seconds[mode] else 0.0,
            "ms_per_token": 1000 * seconds[mode] / max(1, n_tokens),
            "vs_plain": statistics.median(p / m for p, m in zip(per_prompt["plain"], per_prompt[mode])),
            "vs_ngram": statistics.median(p / m for p, m in zip(per_prompt["ngram"], per_prompt[mode])),
            "vs_plain_total": seconds["plain"] / seconds[mode],
            "identical": identical[mode],
        })
    report = {"target": target_name, "layers": len(lean.layers), "prompts": len(requests), "max_new": max_new,
              "context_tokens": len(context), "target_step_ms": costs["target"]["ms"], "tokens": n_tokens,
              "draft_p_min": p_min, "rows": rows,
              "agreement_by_depth": {n.partition(":")[2]: a[0] / a[1] for n, a in agree.items()
                                     if a[1] and n.startswith("self:") and n.count(":") == 1}}
    print(_table(report), file=out, flush=True)
    return report


def _table(report: dict) -> str:
    def f(v, spec):
        return "-" if v is None else format(v, spec)

    head = (f"{'mode':<14}{'step':>7}{'agree':>7}{'accept':>8}{'tok/ver':>8}{'draft%':>8}"
            f"{'ms/tok':>8}{'x plain':>9}{'x ngram':>9}  same")
    lines = [head]
    for r in report["rows"]:
        lines.append(f"{r['mode']:<14}{f(r['step_fraction'], '.2f'):>7}{f(r['agreement'], '.2f'):>7}"
                     f"{f(r['acceptance'], '.2f'):>8}{f(r['tokens_per_verify'], '.2f'):>8}"
                     f"{100 * r['draft_share']:>7.0f}%{r['ms_per_token']:>8.1f}{r['vs_plain']:>9.2f}"
                     f"{r['vs_ngram']:>9.2f}  {'yes' if r['identical'] else 'NO'}")
    depths = sorted(report["agreement_by_depth"].items(), key=lambda kv: int(kv[0]))
    lines.append("agreement by depth (full head): " + ", ".join(f"{n} layers {a:.2f}" for n, a in depths))
    lines.append("step: a draft step's time / a target step's (median of per-round ratios); agree: the draft's "
                 "top-1 equals the target's greedy token (teacher-forced); accept: drafted tokens the target kept; "
                 "tok/ver: tokens per verify forward; draft%: time in the drafter (its prefill included); "
                 "x plain / x ngram: median over prompts of that mode's time / this mode's, same tokens")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="", help="model (default: the bundled default, SmolLM2-135M)")
    p.add_argument("--layers", default="4,8,12", help="comma-separated draft depths")
    p.add_argument("--heads", default="full,4096", help="comma-separated head sizes (full = the whole vocabulary)")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--max-new", type=int, default=64)
    p.add_argument("--prompt-chars", type=int, default=1500)
    p.add_argument("--steps", type=int, default=60, help="decode steps timed per model for the step cost")
    p.add_argument("--confidence", type=float, default=None, help="the drafter's p_min (default: SpecConfig's)")
    p.add_argument("--probe", default="16,20,24,28", help="further depths whose agreement alone is measured")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eagle", default=None, metavar="FILE",
                   help='also an EAGLE draft: "eagle" (the shipped one) or a file from draftline train-eagle')
    p.add_argument("--json", action="store_true")


def run_bench_selfdraft(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING)
    try:
        heads = [None if h in ("full", "") else int(h) for h in args.heads.split(",")]
        layers = [int(n) for n in args.layers.split(",") if n]
        probe = [int(n) for n in args.probe.split(",") if n]
    except ValueError as exc:
        print(f"bench selfdraft: --layers, --heads and --probe take numbers ({exc})", file=sys.stderr)
        return 2
    if args.prompts < 1 or args.max_new < 1 or args.steps < 1:
        print(f"bench selfdraft: --prompts, --max-new and --steps must be at least 1 "
              f"(got {args.prompts}, {args.max_new}, {args.steps})", file=sys.stderr)
        return 2
    try:
        report = measure(args.target, layers, heads, args.prompts, args.max_new,
                         args.prompt_chars, args.steps, args.seed, args.confidence,
                         probe, out=sys.stderr if args.json else sys.stdout, eagle=args.eagle)
    except (OSError, ValueError) as exc:  # a model that does not exist or is not lean, an EAGLE file it cannot read
        from engine.bench import first_line

        print(f"bench selfdraft: {first_line(exc)}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=2))
    return 0
