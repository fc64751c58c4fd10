"""Benchmarks: indexing speed / update and query latency, and CrossCodeEval-style retrieval recall."""

from __future__ import annotations

import ast
import logging
import os
import random
import resource
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from .config import IndexConfig
from .dense import make_embedder
from .files import FileFilter
from .index import MODES, Index

log = logging.getLogger(__name__)


def percentile(values: list[float], q: float, digits: int = 3) -> float:
    """The q-th percentile (0-100) of ``values``, rounded; 0.0 for none. An observed value (the next
    one up, never an interpolation): the one percentile every benchmark reports with."""
    return round(float(np.percentile(values, q, method="higher")), digits) if len(values) else 0.0


def _need_directory(directory, bench: str) -> None:
    """A missing or non-directory DIR is the user's mistake: one line and exit status 1, not a traceback (or,
    for retrieval, a report of 0 tasks that looks like a measurement)."""
    if not Path(directory).is_dir():
        raise SystemExit(f"draftline bench {bench}: {directory} is not a directory")


def _peak_rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)


def _copy_prefix(src: Path, dst: Path, max_chars: int | None, ignore: tuple[str, ...] = ()) -> tuple[int, int]:
    """Copy indexable files of ``src`` into ``dst`` until ``max_chars`` characters. Returns (files, chars)."""
    walk = FileFilter([src], IndexConfig(extra_ignore=ignore)).walk()
    files = chars = 0
    for entry in walk.files:
        try:
            text = Path(entry.path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if max_chars is not None and chars >= max_chars:
            break
        target = dst / os.path.relpath(entry.path, src)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        files += 1
        chars += len(text)
    return files, chars


def bench_index(directory: Path, max_chars: int | None = None, updates: int = 40, queries: int = 100,
                seed: int = 0, ignore: tuple[str, ...] = ()) -> dict:
    """Full index of (the first ``max_chars`` of) DIR, then edit→searchable and query latencies."""
    _need_directory(directory, "index")
    rng = random.Random(seed)
    work = Path(tempfile.mkdtemp(prefix="draftline-bench-"))
    try:
        ws, cache = work / "ws", work / "cache"
        ws.mkdir()
        _copy_prefix(Path(directory), ws, max_chars, ignore)
        config = IndexConfig(cache_dir=cache)
        t0 = time.perf_counter()
        embedder = make_embedder(config.embedder, config.resolved_model_cache_dir(), config.model2vec_dims)
        embedder_load_s = time.perf_counter() - t0
        with Index([ws], config, embedder=embedder) as index:
            t0 = time.perf_counter()
            summary = index.build()
            full_index_s = time.perf_counter() - t0
            paths = sorted({c.path for c in index._chunks.values()})
            update_ms, found = [], 0
            for path in rng.sample(paths, min(updates, len(paths))):
                marker = "".join(rng.choice("bcdfghjklmnpqrstvwxz") for _ in range(14))  # one rare token
                with open(path, "a", encoding="utf-8") as fh:
                    fh.write(f"\n# {marker}\n")
                t0 = time.perf_counter()
                index.touch(path)
                index.flush()
                update_ms.append((time.perf_counter() - t0) * 1e3)
                hits = index.search(marker, k=1, mode="bm25")
                found += bool(hits and hits[0].path == path)
            # the LSP path: one open buffer edited again and again (didChange -> touch(path, text))
            big = [p for p in paths if len(index._path_chunks.get(p, ())) >= 50] or paths
            erng = random.Random(seed + 1)  # own stream: the query sample stays what it was
            buffer_path = erng.choice(big) if big else None
            edit_ms = []
            if buffer_path is not None:
                buffer = Path(buffer_path).read_text(encoding="utf-8").split("\n")
                for i in range(20):
                    at = erng.randrange(len(buffer) + 1)
                    buffer.insert(at, f"edited_{i} = {i}")
                    t0 = time.perf_counter()
                    index.touch(buffer_path, text="\n".join(buffer))
                    index.flush()
                    edit_ms.append((time.perf_counter() - t0) * 1e3)
                index.touch(buffer_path)
                index.flush()
            texts = [c.text for c in index._chunks.values()]
            sample = []
            for text in rng.sample(texts, min(queries, len(texts))):
                lines = text.splitlines()
                cut = rng.randrange(1, max(2, len(lines)))
                sample.append("\n".join(lines[:cut])[-1500:] or text[:200])
            query_ms: dict[str, list[float]] = {}
            for mode in MODES:
                if sample:  # an empty workspace has nothing to query: no samples, percentiles 0.0
                    index.search(sample[0], k=10, mode=mode)  # warm
                times = []
                for q in sample:
                    t0 = time.perf_counter()
                    index.search(q, k=10, mode=mode)
                    times.append((time.perf_counter() - t0) * 1e3)
                query_ms[mode] = times
            return {
                "files": summary["files"],
                "chunks": summary["chunks"],
                "chars": summary["chars"],
                "full_index_s": round(full_index_s, 3),
                "embedder": index.stats().embedder,
                "embedder_load_s": round(embedder_load_s, 3),
                "update_p50_ms": percentile(update_ms, 50),
                "update_p99_ms": percentile(update_ms, 99),
                "updates_searchable": f"{found}/{len(update_ms)}",
                "buffer_edit_p50_ms": percentile(edit_ms, 50),
                "buffer_edit_p99_ms": percentile(edit_ms, 99),
                "buffer_edit_chars": len("\n".join(buffer)) if buffer_path is not None else 0,
                "query_p50_ms": {m: percentile(v, 50) for m, v in query_ms.items()},
                "query_p99_ms": {m: percentile(v, 99) for m, v in query_ms.items()},
                # the percentiles are observed values: over 100 or fewer samples a p99 is the largest
                "samples": {"updates": len(update_ms), "buffer_edits": len(edit_ms), "queries": len(sample)},
                "peak_rss_mb": _peak_rss_mb(),
            }
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ---- retrieval quality ------------------------------------------------------
def _resolve_module(root: Path, current: Path, module: str | None, level: int) -> Path | None:
    parts = module.split(".") if module else []
    bases = []
    if level:
        base = current.parent
        for _ in range(level - 1):
            base = base.parent
        bases.append(base)
    else:
        bases.extend([root] + [p for p in current.parents if root in p.parents])
        if (root / "__init__.py").is_file():  # DIR is itself a package: absolute imports start above it
            bases.append(root.parent)
    for base in bases:
        target = base.joinpath(*parts) if parts else base
        for candidate in (target.with_suffix(".py") if parts else None, target / "__init__.py"):
            if candidate is not None and candidate.is_file() and candidate != current:
                return candidate
    return None


def _tasks(root: Path, paths: list[str], context_lines: int) -> list[dict]:
    """For each name imported from a sibling module, the first later line that uses it."""
    tasks = []
    for path in paths:
        if not path.endswith(".py"):
            continue
        try:
            source = Path(path).read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        # ast counts lines by "\n" only; str.splitlines() also splits at form feeds and other
        # separators (several stdlib files have ^L lines), which shifted every later query
        lines = source.split("\n")
        imported: dict[str, tuple[Path, int]] = {}
        for node in tree.body:
            if isinstance(node, ast.ImportFrom):
                target = _resolve_module(root, Path(path), node.module, node.level)
                if target is None:
                    continue
                for alias in node.names:
                    if alias.name != "*" and alias.asname is None:
                        imported[alias.name] = (target, node.end_lineno or node.lineno)
        if not imported:
            continue
        first_use: dict[str, int] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id in imported and node.lineno > imported[node.id][1]:
                if node.id not in first_use or node.lineno < first_use[node.id]:
                    first_use[node.id] = node.lineno
        for name, lineno in sorted(first_use.items(), key=lambda kv: kv[1]):
            prefix = "\n".join(lines[max(0, lineno - 1 - context_lines) : lineno - 1])
            tasks.append({"path": path, "name": name, "line": lineno, "target": str(imported[name][0]), "query": prefix})
    return tasks


def _gold(index: Index, task: dict) -> list:
    """The module-level definitions of the task's name in the module it is imported from.

    Methods or nested functions of that module with the same name are not what the import
    refers to, so they are left out (they used to count as hits).
    """
    return [s for s in index.definitions(task["name"]) if s.path == task["target"] and s.container is None]


def bench_retrieval(directory: Path, max_tasks: int = 500, ks: tuple[int, ...] = (1, 5, 10), seed: int = 0,
                    context_lines: int = 40, config: IndexConfig | None = None) -> dict:
    """Recall@k of the chunk defining an imported name, querying with the lines before its first use.

    A task is (file, name imported from a sibling module, first line using it) where that
    module defines the name at module level; the query is the ``context_lines`` lines before
    that line and the current file is excluded. ``modes``: a hit is the chunk holding the
    definition's first line (its ``def``/``class``/assignment). ``modes_any_part``: any chunk
    overlapping the definition (e.g. one method of an imported class) counts.
    """
    _need_directory(directory, "retrieval")
    rng = random.Random(seed)
    root = Path(directory).resolve()
    work = Path(tempfile.mkdtemp(prefix="draftline-bench-"))
    base = config or IndexConfig()
    try:
        with Index([root], replace(base, cache_dir=work / "cache")) as index:
            t0 = time.perf_counter()
            index.build()
            build_s = time.perf_counter() - t0
            paths = sorted({c.path for c in index._chunks.values()})
            tasks = [t for t in _tasks(root, paths, context_lines) if _gold(index, t)]
            rng.shuffle(tasks)  # definitions missing (re-exports, dynamic): no chunk to find, left out
            tasks = tasks[:max_tasks]
            depth = max(ks)
            strict = {m: {k: 0 for k in ks} for m in (*MODES, "definitions")}
            loose = {m: {k: 0 for k in ks} for m in MODES}
            for task in tasks:
                truth = _gold(index, task)
                heads = {s.chunk_id for s in truth if s.chunk_id >= 0}

                def rank_of(chunks, any_part: bool) -> int | None:
                    for r, c in enumerate(chunks):
                        if any_part:
                            if any(c.path == s.path and c.start_line <= s.end_line and c.end_line >= s.start_line
                                   for s in truth):
                                return r
                        elif c.id in heads:
                            return r
                    return None

                for mode in MODES:
                    found = index.search(task["query"], k=depth, exclude=task["path"], mode=mode)
                    r, r_any = rank_of(found, False), rank_of(found, True)
                    for k in ks:
                        strict[mode][k] += r is not None and r < k
                        loose[mode][k] += r_any is not None and r_any < k
                defs = [s for s in index.definitions(task["name"]) if s.path != task["path"]]
                r = next((i for i, s in enumerate(defs) if s.path == task["target"]), None)
                for k in ks:
                    strict["definitions"][k] += r is not None and r < k
            used = len(tasks)

            def table(hits):
                return {m: {f"recall@{k}": round(v / used, 4) if used else 0.0 for k, v in per.items()}
                        for m, per in hits.items()}

            return {"tasks": used, "modes": table(strict), "modes_any_part": table(loose),
                    "context_lines": context_lines, "chunks": index.stats().chunks,
                    "build_s": round(build_s, 3), "embedder": index.stats().embedder}
    finally:
        shutil.rmtree(work, ignore_errors=True)
