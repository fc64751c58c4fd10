"""Plain functions behind ``draftline index`` and ``draftline search`` (argparse wiring lives in lsp_server).

These are the only indexer functions that write to stdout; progress and logs go to stderr.
"""

from __future__ import annotations

import argparse
import json as jsonlib
import logging
import os
import sys
from pathlib import Path
from typing import TextIO

from .config import IndexConfig
from .index import MODES, Index

log = logging.getLogger(__name__)


def _stderr_progress(done: int, total: int, message: str) -> None:
    if total and (done == total or done % 50 == 0 or done == 0):
        print(f"[index] {done}/{total} {message}", file=sys.stderr, flush=True)


def index_command(directory: str | Path, json: bool = False, config: IndexConfig | None = None,
                  out: TextIO | None = None) -> dict:
    """Index DIR (incrementally, using the cache) and print a summary. Returns the summary."""
    out = out or sys.stdout
    with Index([Path(directory)], config or IndexConfig()) as index:
        summary = index.build(progress=_stderr_progress)
        summary["embedder"] = index.stats().embedder
        summary["cache_dir"] = str(index.cache_dir)
    if json:
        out.write(jsonlib.dumps(summary) + "\n")
    else:
        skipped = ", ".join(f"{k}={v}" for k, v in summary["skipped"].items()) or "none"
        out.write(
            f"{summary['files']} files, {summary['chunks']} chunks, {summary['chars']} chars, "
            f"{summary['seconds']:.2f}s; skipped: {skipped}\n"
        )
    out.flush()
    return summary


def _result_dict(chunk, root: Path) -> dict:
    path = chunk.path
    try:
        rel = os.path.relpath(path, root)
        if not rel.startswith(".."):
            path = rel
    except ValueError:
        pass
    return {"path": path, "start_line": chunk.start_line, "end_line": chunk.end_line, "score": round(chunk.score, 6)}


def search_command(directory: str | Path, query: str | None = None, queries_file: str | Path | None = None,
                   k: int = 10, mode: str = "hybrid", json: bool = False, config: IndexConfig | None = None,
                   out: TextIO | None = None) -> list[dict]:
    """Search DIR for QUERY, or for every JSON string line of ``queries_file``; paths are relative to DIR.

    JSON output: one ``{"results": [{"path", "start_line", "end_line", "score"}]}`` object per query, per line.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}")
    if (query is None) == (queries_file is None):
        raise ValueError("give exactly one of query or queries_file")
    out = out or sys.stdout
    root = Path(directory).resolve()
    if queries_file is not None:
        with open(queries_file, encoding="utf-8") as fh:
            queries = [jsonlib.loads(line) for line in fh if line.strip()]
    else:
        queries = [query]
    answers = []
    with Index([root], config or IndexConfig()) as index:
        index.build(progress=_stderr_progress)
        for q in queries:
            chunks = index.search(str(q), k=k, mode=mode)
            answer = {"results": [_result_dict(c, root) for c in chunks]}
            answers.append(answer)
            if json:
                out.write(jsonlib.dumps(answer) + "\n")
            else:
                if len(queries) > 1:
                    out.write(f"# {str(q)[:80]!r}\n")
                for r, c in zip(answer["results"], chunks):
                    label = f" {c.kind} {c.name}" if c.name else f" {c.kind}"
                    out.write(f"{r['score']:.4f}  {r['path']}:{r['start_line']}-{r['end_line']}{label}\n")
    out.flush()
    return answers


# ---- argparse helpers (optional) ---------------------------------------
def add_index_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir")
    parser.add_argument("--json", action="store_true")


def add_search_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir")
    parser.add_argument("query", nargs="?")
    parser.add_argument("--queries", dest="queries_file", help="file with one JSON string per line")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--mode", choices=MODES, default="hybrid")
    parser.add_argument("--json", action="store_true")


def add_bench_index_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir")
    parser.add_argument("--max-chars", type=int, default=None)
    parser.add_argument("--ignore", action="append", default=[], help="extra gitignore-style pattern (repeatable)")
    parser.add_argument("--json", action="store_true")


def add_bench_retrieval_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir")
    parser.add_argument("--max-tasks", type=int, default=500)
    parser.add_argument("--context-lines", type=int, default=40)
    parser.add_argument("--json", action="store_true")


def bench_index(directory: str | Path, max_chars: int | None = None, json: bool = False,
                ignore: tuple[str, ...] = (), out: TextIO | None = None) -> dict:
    from .bench import bench_index as run

    return _emit(run(Path(directory), max_chars=max_chars, ignore=tuple(ignore)), json, out)


def bench_retrieval(directory: str | Path, json: bool = False, max_tasks: int = 500, context_lines: int = 40,
                    out: TextIO | None = None) -> dict:
    from .bench import bench_retrieval as run

    return _emit(run(Path(directory), max_tasks=max_tasks, context_lines=context_lines), json, out)


def _emit(result: dict, json: bool, out: TextIO | None) -> dict:
    out = out or sys.stdout
    out.write((jsonlib.dumps(result) if json else jsonlib.dumps(result, indent=2)) + "\n")
    out.flush()
    return result


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry for development: ``python -m indexer.cli index|search|bench-index|bench-retrieval``."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    parser = argparse.ArgumentParser(prog="python -m indexer.cli")
    sub = parser.add_subparsers(dest="cmd", required=True)
    add_index_arguments(sub.add_parser("index"))
    add_search_arguments(sub.add_parser("search"))
    add_bench_index_arguments(sub.add_parser("bench-index"))
    add_bench_retrieval_arguments(sub.add_parser("bench-retrieval"))
    args = parser.parse_args(argv)
    return dispatch(args.cmd, args)


def dispatch(cmd: str, a: argparse.Namespace) -> int:
    """Run one parsed indexer command (the `draftline` CLI calls this)."""
    if cmd == "index":
        index_command(a.dir, a.json)
    elif cmd == "search":
        search_command(a.dir, a.query, a.queries_file, a.k, a.mode, a.json)
    elif cmd == "bench-index":
        bench_index(a.dir, a.max_chars, a.json, a.ignore)
    else:
        bench_retrieval(a.dir, a.json, a.max_tasks, a.context_lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
