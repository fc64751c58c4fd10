"""``draftline bench index-yield``: decoding while the workspace index builds, with the build yielding to
generations between files (what the server does) and without, interleaved in one process."""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from lsp_server.scheduler import YIELD_S

DEMO = Path(__file__).parents[2] / "tests" / "demo" / "shapes.py"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("tree", help="a source tree to index (a large one: the build must outlast many answers)")
    p.add_argument("--rounds", type=int, default=1, help="builds of each arm, interleaved")
    p.add_argument("--gap-ms", type=float, default=30.0, help="pause between two answers (a typing gap)")
    p.add_argument("--idle-s", type=float, default=15.0, help="how long decoding is measured with no build first")
    p.add_argument("--json", action="store_true")


def run_bench_index_yield(args: argparse.Namespace) -> int:
    from engine.bundled import DEFAULT_PACKAGE
    from engine.engine import load_engine
    from engine.types import CompletionRequest, Limits, SpecConfig
    from indexer import Index, IndexConfig
    from indexer.bench import percentile

    if not Path(args.tree).is_dir():  # else a build of nothing, over before the first answer: a report of no arms' worth
        print(f"bench index-yield: {args.tree} is not a directory", file=sys.stderr)
        return 2
    engine = load_engine(DEFAULT_PACKAGE, drafter="none")  # the default model, plain decoding (no drafts to vary)
    text = DEMO.read_text()
    request = CompletionRequest(prefix=text[: len(text) // 2], path="shapes.py", mode="multi-line",
                                limits=Limits(max_tokens=48))
    idle = threading.Event()
    idle.set()

    def answers(until, at_least: int = 0) -> list[float]:
        """Decode ms/token of answers one after another (a gap between), while ``until()`` (and at least
        ``at_least`` of them)."""
        out: list[float] = []
        while len(out) < at_least or until():
            idle.clear()
            try:
                r = engine.complete(request, threading.Event(), SpecConfig(drafter="none"))
            finally:
                idle.set()
            out.append((r.stats.total_s - r.stats.prefill_s) * 1e3 / max(1, len(r.tokens) - 1))
            time.sleep(args.gap_ms / 1e3)
        return out

    def arm(yielding: bool) -> dict:
        cache = Path(tempfile.mkdtemp(prefix="draftline-bench-index-"))
        index = Index([Path(args.tree)], IndexConfig(embedder="none", cache_dir=cache))
        if yielding:
            index.yield_to = lambda: idle.wait(YIELD_S)  # as the server's Scheduler.yield_to_generation
        took: dict[str, float] = {}

        def build() -> None:
            started = time.perf_counter()
            index.build()
            took["s"] = time.perf_counter() - started

        thread = threading.Thread(target=build)
        thread.start()
        ms = answers(thread.is_alive)  # only the answers the build overlapped
        thread.join()
        index.close()
        shutil.rmtree(cache, ignore_errors=True)
        return {"yielding": yielding, "answers": len(ms), "build_s": round(took["s"], 1),
                "ms_per_token_p50": round(statistics.median(ms), 1) if ms else None,
                "ms_per_token_p90": percentile(ms, 90, 1) if ms else None}

    deadline = time.monotonic() + args.idle_s
    idle_ms = answers(lambda: time.monotonic() < deadline, at_least=1)
    report = {"tree": args.tree, "no_build_ms_per_token_p50": round(statistics.median(idle_ms), 1), "arms": []}
    for _ in range(args.rounds):
        for yielding in (False, True):
            report["arms"].append(arm(yielding))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"no build: decode {report['no_build_ms_per_token_p50']} ms/token (p50)")
        for a in report["arms"]:
            print(f"build {'yielding' if a['yielding'] else 'not yielding'}: decode p50 {a['ms_per_token_p50']} "
                  f"p90 {a['ms_per_token_p90']} ms/token over {a['answers']} answers; build {a['build_s']} s")
    return 0
