"""The Index facade: build, incremental touch/remove, hybrid search and definitions lookup."""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from .bm25 import Bm25Index, chunk_tokens
from .chunker import Chunker
from .config import IndexConfig
from .dense import Embedder, make_embedder
from .files import BULK_SKIPS, IGNORE_FILE_NAMES, SKIP_DETAILS, FileFilter, SourceFile, WalkResult, shown
from .imports import FileTable
from .models import Chunk, IndexStats, Symbol
from .store import FileRecord, Store
from .vectors import VectorMatrix
from .worker import CoalescingWorker

log = logging.getLogger(__name__)

Progress = Callable[[int, int, str], None]
MODES = ("hybrid", "bm25", "dense")
BUILD_COMMIT_S = 2.0  # during build(), make BM25 additions searchable at most this often
_DEFAULT = object()
# Part of the store's content fingerprint: bump it when a change to chunker.py or files.py changes
# what an unchanged file yields (chunks, symbols, skips), so that existing caches are rebuilt.
CHUNKER_VERSION = "4"  # 2: a notebook (.ipynb) is its code cells, not its JSON; 3: more languages' symbols and named chunks; 4: a notebook's other-language and blank cells out, nbformat 3 read


def content_fingerprint(config: IndexConfig) -> str:
    """A hash of the settings that decide which files are read and how they are chunked: the store is
    rebuilt when it changes (build() alone re-reads only files whose mtime or size changed)."""
    secrets = ((tuple(config.secret_name_patterns), tuple(config.secret_content_patterns))
               if config.exclude_secrets else ())
    fields = (CHUNKER_VERSION, config.exclude_secrets, secrets, config.max_file_bytes, config.max_chunk_lines,
              config.window_lines, config.max_chunk_chars, config.follow_symlinks,
              config.symlinks_outside_roots, tuple(config.extra_ignore))
    return hashlib.sha256(repr(fields).encode()).hexdigest()[:16]


class Index:
    """A workspace index. Thread-safe: searches may run while the background worker updates.

    ``embedder``: leave out to build the one ``config.embedder`` names, pass ``None`` for
    BM25 only, or pass any :class:`Embedder`.
    """

    def __init__(self, roots: Iterable[Path | str], config: IndexConfig | None = None, embedder=_DEFAULT):
        self.roots = [Path(os.path.abspath(r)) for r in roots]
        if not self.roots:
            raise ValueError("Index needs at least one root")
        self.config = config or IndexConfig()
        self.cache_dir = self.config.resolved_cache_dir(self.roots)
        if embedder is _DEFAULT:
            embedder = make_embedder(self.config.embedder, self.config.resolved_model_cache_dir(),
                                     self.config.model2vec_dims)
        self.embedder: Embedder | None = embedder
        self.filter = FileFilter(self.roots, self.config, extra_excluded_dirs=(self.cache_dir,))
        self.chunker = Chunker(self.config)
        dim = embedder.dim if embedder is not None else 0
        self.store = Store(self.cache_dir, embedder.name if embedder is not None else "none", dim,
                           content=content_fingerprint(self.config))
        self.bm25 = Bm25Index(self.config.bm25_df_cutoff, self.config.max_query_tokens)
        self.vectors = VectorMatrix(dim) if embedder is not None else None
        self._lock = threading.RLock()  # in-memory maps
        self._write_lock = threading.Lock()  # one writer at a time (build or worker)
        self._chunks: dict[int, Chunk] = {}
        self._tokens: dict[int, str] = {}  # chunk id -> indexed token string (reused on re-index)
        self._path_chunks: dict[str, list[int]] = {}
        # name -> path -> its definitions there: a changed file's are dropped by path, not by filtering
        # the name's list (`__init__` had 14,280 entries in a 20k-file tree: each save of a file defining
        # it rescanned them all, ~20 ms a file under the lock that status and typing wait for)
        self._symbols: dict[str, dict[str, list[Symbol]]] = defaultdict(dict)
        self._path_symbols: dict[str, list[Symbol]] = {}
        # stats()' totals, kept as the maps change: summing 250k chunks took ~15 ms under the lock that
        # retrieval waits on, at every status poll
        self._chars = 0
        self._symbol_count = 0
        self._digests: dict[str, str] = {}
        self._overlays: dict[str, str] = {}
        # indexed paths by file and directory name (import resolution), reading re-exports' unsaved text first
        self.files = FileTable(overlay=self._overlays.get)
        # remove()d paths not yet applied: a later touch of the same path (a file moved in under a
        # directory's name) replaces the worker's remove request, not what was under the directory
        self._removed: set[str] = set()
        # called between files while indexing (the server: wait a moment while a generation runs). The
        # indexing thread's Python competes for the GIL with the engine thread's decode loop: during a
        # build of a large tree decoding went from 6.8 to 23 ms a token at low load, 278 ms at load 2
        self.yield_to: Callable[[], object] | None = None
        self._walk_skipped: Counter = Counter()
        self._content_skipped: dict[str, str] = {}
        self._last_index_s = 0.0
        self._worker: CoalescingWorker | None = None
        self._closed = False
        self._load()

    # ---- lifecycle ------------------------------------------------------
    def __enter__(self) -> "Index":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:  # against _ensure_worker: no update thread starts on a closed index
            if self._closed:
                return
            self._closed = True
            worker, self._worker = self._worker, None
        if worker is not None:
            worker.close()
        self.bm25.close()
        self.store.close()

    def _load(self) -> None:
        """Fill memory from the store; only chunks lacking a vector (new embedder) are embedded."""
        t0 = time.perf_counter()
        states, stored_chunks, stored_symbols = self.store.read_all()
        self._digests = {p: s.digest for p, s in states.items()}
        for path in states:  # every indexed file, chunks or not (an empty __init__.py names its package)
            self.files.add(path)
        missing: list[Chunk] = []
        ids: list[int] = []
        vecs: list[np.ndarray] = []
        for stored in stored_chunks:
            chunk = stored.chunk
            self._chunks[chunk.id] = chunk
            self._chars += len(chunk.text)
            self._tokens[chunk.id] = stored.tokens
            self._path_chunks.setdefault(chunk.path, []).append(chunk.id)
            self.bm25.add(chunk.id, chunk.path, stored.tokens)
            if self.vectors is not None:
                if stored.vector is None:
                    missing.append(chunk)
                else:
                    ids.append(chunk.id)
                    vecs.append(stored.vector)
        if self.vectors is not None and ids:
            self.vectors.add(ids, np.vstack(vecs))
        for sym in stored_symbols:
            self._symbols[sym.name].setdefault(sym.path, []).append(sym)
            self._path_symbols.setdefault(sym.path, []).append(sym)
            self._symbol_count += 1
        self.bm25.commit()
        if missing and self.embedder is not None:
            log.info("embedding %d stored chunks for %s", len(missing), self.embedder.name)
            step = self.config.embed_batch
            for i in range(0, len(missing), step):
                part = missing[i : i + step]
                mat = self.embedder.embed([c.indexed_text for c in part])
                self.store.put_vectors([c.id for c in part], mat)
                self.vectors.add([c.id for c in part], mat)
        if self._chunks:
            log.info("loaded %d files, %d chunks in %.2fs", len(states), len(self._chunks), time.perf_counter() - t0)

    # ---- building -------------------------------------------------------
    def build(self, progress: Progress | None = None) -> dict:
        """Walk the roots and bring the index up to date (only changed files are re-read)."""
        t0 = time.perf_counter()
        with self._write_lock:
            walk = self.filter.walk()
            states = self.store.file_states()
            with self._lock:
                self._walk_skipped = walk.skipped
                self._content_skipped = {}
            seen = {e.path for e in walk.files}
            gone = [p for p in states if p not in seen and p not in self._overlays]
            todo = [e for e in walk.files
                    if e.path in self._overlays or e.path not in states
                    or states[e.path].mtime != e.mtime or states[e.path].size != e.size]
            total = len(todo)
            if progress:
                progress(0, total, f"{len(walk.files)} files, {total} to index")
            removals = list(gone)
            batch: list[SourceFile] = []
            batch_chunks = 0
            done = 0
            # BM25 commits at most every BUILD_COMMIT_S: each commit makes a tantivy segment, and
            # one per batch (~140 for the stdlib) made the build 3x slower for BM25 and left merges
            # that made the first updates' commits take 15-25 ms instead of 2-8 ms.
            last_commit = time.perf_counter()
            for entry in todo:
                self._yield()
                src, reason = self.filter.read(entry.path, self._overlays.get(entry.path))
                done += 1
                if src is None:
                    self._note_skip(entry.path, reason)
                    if entry.path in states:
                        removals.append(entry.path)
                    continue
                old = states.get(entry.path)
                if old is not None and old.digest == src.digest and entry.path not in self._overlays:
                    self.store.set_file_state(entry.path, src.mtime, src.size)  # touched, not changed
                    continue
                batch.append(src)
                batch_chunks += max(1, len(src.text) // 1500)
                if batch_chunks >= self.config.embed_batch:
                    searchable = time.perf_counter() - last_commit >= BUILD_COMMIT_S
                    self._commit_each_if_needed(batch, removals, commit=searchable)
                    if searchable:
                        last_commit = time.perf_counter()
                    removals, batch, batch_chunks = [], [], 0
                    if progress:
                        progress(done, total, entry.path)
            self._commit_each_if_needed(batch, removals)
            if progress:
                progress(total, total, "done")
        self._last_index_s = time.perf_counter() - t0
        st = self.stats()
        log.info("indexed %d files, %d chunks in %.1f s (%d read now); skipped: %s", st.files, st.chunks,
                 self._last_index_s, total, ", ".join(f"{k} {v}" for k, v in sorted(st.skipped.items())) or "none")
        return {"files": st.files, "chunks": st.chunks, "chars": st.chars, "symbols": st.symbols,
                "seconds": round(self._last_index_s, 3), "skipped": st.skipped, "indexed_now": total}


    def _commit_each_if_needed(self, sources: list[SourceFile], removals: list[str], commit: bool = True) -> None:
        """The build's batch, or where it fails, each of its files on its own: one file that cannot be
        indexed is logged and left out (the next build tries it again), never the build's end."""
        try:
            self._commit_sources(sources, removals, commit=commit)
            return
        except Exception:
            if len(sources) + len(removals) <= 1:
                raise
            log.warning("indexing a batch of %d file(s) failed: indexing them one at a time",
                        len(sources) + len(removals), exc_info=True)
        for src, gone in [(s, []) for s in sources] + [(None, [p]) for p in removals]:
            try:
                self._commit_sources([src] if src is not None else [], gone, commit=False)
            except Exception as exc:
                log.error("not indexed: %s (%s: %s)", shown(src.path if src is not None else gone[0]),
                          type(exc).__name__, exc)
        if commit:
            self.bm25.commit()

    def _note_skip(self, path: str, reason: str | None) -> None:
        if not reason or reason in ("vanished", "outside_roots", "ignored"):
            with self._lock:  # gone or out of scope now: no longer a skip to report (nor to keep a week)
                self._content_skipped.pop(path, None)
        else:
            with self._lock:
                self._content_skipped[path] = reason
            # one line a file at INFO for what a user may want to know; the bulk kinds (a tree's
            # .pyc and .so files: 10,484 "binary" lines on every start of a 20k-file tree) at DEBUG
            level = logging.DEBUG if reason in BULK_SKIPS else logging.INFO
            log.log(level, "skip %s (%s) %s", shown(path), reason, SKIP_DETAILS.get(reason, ""))

    def _display(self, path: str) -> str:
        root = self.filter.root_of(Path(path))
        return os.path.relpath(path, root) if root is not None else path

    def _yield(self) -> None:
        """Between files: let a generation on the engine thread run first (``yield_to``)."""
        if self.yield_to is not None:
            self.yield_to()

    def _records(self, sources: list[SourceFile]) -> list[FileRecord]:
        """Chunk, tokenize and embed. A chunk whose text the file already had keeps that chunk's id,
        tokens and vector (``FileRecord.reuse``), so an edit rewrites only the chunks it changed."""
        chunked = []
        for s in sources:
            self._yield()
            chunked.append(self.chunker.chunk(s.path, s.text, self._display(s.path)))
        records = []
        todo: list[tuple[int, int, str]] = []  # (record, chunk, text) needing a vector
        for s, cf in zip(sources, chunked):
            previous: dict[str, list[int]] = {}
            with self._lock:
                for cid in self._path_chunks.get(s.path, ()):
                    old_chunk = self._chunks.get(cid)
                    if old_chunk is not None:
                        previous.setdefault(old_chunk.indexed_text, []).append(cid)
            reuse, tokens, vecs = [], [], []
            for j, chunk in enumerate(cf.chunks):
                text = chunk.indexed_text
                same = previous.get(text)
                old = same.pop(0) if same else -1
                tok = self._tokens.get(old) if old >= 0 else None
                vec = self.vectors.get(old) if old >= 0 and self.vectors is not None else None
                if tok is None or (self.vectors is not None and vec is None):
                    old = -1
                reuse.append(old)
                tokens.append(tok if tok is not None else chunk_tokens(text))
                vecs.append(vec)
                if vec is None and self.embedder is not None:
                    todo.append((len(records), j, text))
            records.append((s, cf, tokens, vecs, reuse))
        if todo:
            mat = self.embedder.embed([t for _, _, t in todo])
            for (r, j, _), vec in zip(todo, mat):
                records[r][3][j] = vec
        return [
            FileRecord(s.path, s.mtime, s.size, s.digest, cf.language, cf.chunks, tokens, cf.symbols,
                       np.vstack(vecs) if self.embedder is not None and vecs else None, reuse)
            for s, cf, tokens, vecs, reuse in records
        ]

    def _commit_sources(self, sources: list[SourceFile], removals: list[str], commit: bool = True) -> None:
        """Persist then publish: store first (writes and deletes in one transaction), memory second;
        ``commit`` makes it searchable."""
        records = self._records(sources) if sources else []
        ids = self.store.write_files(records, removals)
        with self._lock:
            for path in removals:
                self._forget(path)
            for rec, rec_ids in zip(records, ids):
                self._publish(rec, rec_ids)
        if commit:
            self.bm25.commit()

    def _forget(self, path: str) -> None:
        old = self._path_chunks.pop(path, [])
        if old:
            self.bm25.remove_path(path)
            if self.vectors is not None:
                self.vectors.remove(old)
            for cid in old:
                self._drop_chunk(cid)
        self._forget_symbols(path)
        self._digests.pop(path, None)
        self.files.remove(path)
        self.chunker.forget(path)

    def _drop_chunk(self, cid: int) -> None:
        chunk = self._chunks.pop(cid, None)
        if chunk is not None:
            self._chars -= len(chunk.text)
        self._tokens.pop(cid, None)

    def _forget_symbols(self, path: str) -> None:
        syms = self._path_symbols.pop(path, [])
        self._symbol_count -= len(syms)
        for name in {sym.name for sym in syms}:
            by_path = self._symbols.get(name)
            if by_path is not None:
                by_path.pop(path, None)
                if not by_path:
                    del self._symbols[name]

    def _publish(self, rec: FileRecord, ids: list[int]) -> None:
        """Replace the file's chunks in memory; chunks kept by the store (same id) stay in BM25 and the matrix."""
        old = self._path_chunks.get(rec.path, [])
        kept = set(ids).intersection(old)
        dropped = [cid for cid in old if cid not in kept]
        if len(kept) < len(dropped):  # mostly new: one delete by path is cheaper than one per chunk
            if old:
                self.bm25.remove_path(rec.path)
            kept_in_bm25: set[int] = set()
        else:
            self.bm25.remove_ids(dropped)
            kept_in_bm25 = kept
        if self.vectors is not None:
            self.vectors.remove(dropped)
        for cid in old:  # a kept id's chunk is replaced below (its text counted again)
            self._drop_chunk(cid)
        self._forget_symbols(rec.path)
        chunks = [replace(c, id=cid) for c, cid in zip(rec.chunks, ids)]
        fresh: list[int] = []  # rows of rec whose vector is not in the matrix yet
        for i, (c, tokens) in enumerate(zip(chunks, rec.tokens)):
            self._chunks[c.id] = c
            self._chars += len(c.text)
            self._tokens[c.id] = tokens
            if c.id not in kept_in_bm25:
                self.bm25.add(c.id, c.path, tokens)
            if c.id not in kept:
                fresh.append(i)
        self._path_chunks[rec.path] = ids
        self.files.add(rec.path)
        if self.vectors is not None and rec.vectors is not None and fresh:
            self.vectors.add([ids[i] for i in fresh], rec.vectors[fresh])
        syms = [replace(s, chunk_id=ids[s.chunk_index] if 0 <= s.chunk_index < len(ids) else -1) for s in rec.symbols]
        self._path_symbols[rec.path] = syms
        self._symbol_count += len(syms)
        for s in syms:
            self._symbols[s.name].setdefault(s.path, []).append(s)
        self._digests[rec.path] = rec.digest

    # ---- incremental updates ------------------------------------------
    def _ensure_worker(self) -> CoalescingWorker | None:
        """The update thread, started on first use; None once the index is closed."""
        with self._lock:
            if self._closed:
                return None
            if self._worker is None:
                self._worker = CoalescingWorker(self._update_batch)
            return self._worker

    def touch(self, path: Path | str, text: str | None = None) -> None:
        """Mark a file changed. ``text`` is an unsaved buffer that overrides the disk until ``touch(path)``.

        A closed index ignores it (a late editor event or overlay timer must not restart its worker).
        """
        if self._closed:
            return
        p = os.path.abspath(path)
        with self._lock:
            if text is None:
                self._overlays.pop(p, None)
            else:
                self._overlays[p] = text
        if os.path.basename(p) in IGNORE_FILE_NAMES:
            self.filter.invalidate(Path(p).parent)  # the worker re-checks that directory (_update_batch)
        elif (root := self.filter.exclude_root(p)) is not None:
            self.filter.invalidate_root(root)  # .git/info/exclude: the worker re-checks the root
        worker = self._ensure_worker()
        if worker is not None:
            worker.submit(p)

    def close_overlay(self, path: Path | str) -> None:
        self.touch(path)

    def remove(self, path: Path | str) -> None:
        """Drop a file (or every file under a directory) from the index; a closed index ignores it."""
        if self._closed:
            return
        p = os.path.abspath(path)
        with self._lock:
            self._overlays.pop(p, None)
            self._removed.add(p)
        # a directory's rules (and those below it) went with it; an ignore file's: what they hid may be indexed
        self.filter.invalidate(Path(p))
        if os.path.basename(p) in IGNORE_FILE_NAMES:
            self.filter.invalidate(Path(p).parent)
        elif (root := self.filter.exclude_root(p)) is not None:
            self.filter.invalidate_root(root)
        worker = self._ensure_worker()
        if worker is not None:
            worker.submit(p, remove=True)  # a directory's files are found when it is applied (_update_batch)

    def indexed(self, path: Path | str) -> bool:
        """Whether the index holds ``path`` now."""
        with self._lock:
            return os.path.abspath(path) in self._digests

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every touch/remove so far is searchable. False on timeout."""
        return self._worker.flush(timeout) if self._worker is not None else True

    def _update_batch(self, batch: dict[str, bool]) -> None:
        t0 = time.perf_counter()
        with self._write_lock:
            for directory in {os.path.dirname(p) for p in batch if os.path.basename(p) in IGNORE_FILE_NAMES}:
                batch = {**self._ignore_rescan(Path(directory)), **batch}
            for path, root in [(p, r) for p in batch if (r := self.filter.exclude_root(p)) is not None]:
                batch = {**self._ignore_rescan(root), **{q: gone for q, gone in batch.items() if q != path}}
            sources: list[SourceFile] = []
            removals = self._removed_under(batch)
            for path, force_remove in batch.items():
                known = path in self._digests
                if force_remove:
                    if known:
                        removals.append(path)
                    continue
                reason = self.filter.path_reason(Path(path))
                src = None
                if reason is None:
                    with self._lock:
                        overlay = self._overlays.get(path)
                    src, reason = self.filter.read(path, overlay)
                if src is None:
                    self._note_skip(path, reason)
                    if known:
                        removals.append(path)
                    continue
                with self._lock:
                    self._content_skipped.pop(path, None)
                if self._digests.get(path) == src.digest:
                    continue
                sources.append(src)
            if sources or removals:
                self._commit_sources(sources, removals)
        log.debug("updated %d path(s) in %.1f ms", len(batch), (time.perf_counter() - t0) * 1e3)

    def _removed_under(self, batch: dict[str, bool]) -> list[str]:
        """The indexed files under the batch's removed directories, found now (under the write lock),
        not when remove() was called: files a batch was indexing then are indexed by now and go too.
        Those the batch itself touches get its usual checks; an open editor's unsaved buffer stays."""
        with self._lock:
            removed, self._removed = self._removed, set()
        removed.update(p for p, gone in batch.items() if gone)
        self._forget_skips(removed)
        prefixes = tuple(p.rstrip(os.sep) + os.sep for p in removed if p not in self._digests)
        if not prefixes:
            return []
        with self._lock:
            return [q for q in self._digests if q.startswith(prefixes) and q not in batch and q not in self._overlays]

    def _forget_skips(self, removed: set[str]) -> None:
        """Removed files, and every file under removed directories, leave the skip report: a deleted
        binary or too large file was reported skipped for good (stats().skipped grew with every one).
        An open editor's unsaved buffer stays what counts, and skipped, as _removed_under keeps it."""
        if not removed:
            return
        under = tuple(p.rstrip(os.sep) + os.sep for p in removed)
        with self._lock:
            for q in [q for q in self._content_skipped
                      if (q in removed or q.startswith(under)) and q not in self._overlays]:
                del self._content_skipped[q]

    def _ignore_rescan(self, directory: Path) -> dict[str, bool]:
        """The paths under ``directory`` whose fate an edit of its ignore file may have changed: those
        indexed that the build's walk no longer finds (now ignored) and those it finds that are not
        indexed (no longer ignored). Each then goes through the batch's usual checks."""
        walked = {e.path for e in self._walk_under(directory).files}
        prefix = str(directory).rstrip(os.sep) + os.sep
        with self._lock:
            indexed = {p for p in self._digests if p.startswith(prefix)}
        return dict.fromkeys(sorted(indexed ^ walked), False)

    def _walk_under(self, directory: Path) -> WalkResult:
        """The build's walk (FileFilter.walk) of one directory; nothing where it or a directory above
        it is itself skipped."""
        result = WalkResult()
        root = self.filter.root_of(directory)
        if root is None:
            return result
        current = root
        for part in directory.relative_to(root).parts:
            current = current / part
            if self.filter.entry_reason(root, current, True):
                return result
        try:
            st = os.stat(directory)
        except OSError:
            return result
        self.filter._walk_dir(root, directory, result, {(st.st_dev, st.st_ino)}, set())
        return result

    # ---- queries ----------------------------------------------------------
    def search(self, query: str, k: int = 10, exclude: Path | str | None = None, mode: str = "hybrid") -> list[Chunk]:
        """Top-k chunks for ``query``; ``exclude`` leaves one file out (the one being edited)."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        if k <= 0 or not query.strip():
            return []
        excl = os.path.abspath(exclude) if exclude is not None else None
        depth = max(k, self.config.fusion_depth) if mode == "hybrid" else k
        ranked: list[list[tuple[int, float]]] = []
        if mode in ("bm25", "hybrid"):
            ranked.append([(h.chunk_id, h.score) for h in self.bm25.search(query, depth, excl)])
        if mode in ("dense", "hybrid") and self.vectors is not None and self.embedder is not None:
            qv = self.embedder.embed([query])[0]
            with self._lock:
                skip = set(self._path_chunks.get(excl, ())) if excl else None
            ranked.append([(h.chunk_id, h.score) for h in self.vectors.search(qv, depth, skip)])
        if len(ranked) == 1:
            scored = ranked[0]
        else:
            fused: dict[int, float] = defaultdict(float)
            for hits in ranked:
                for rank, (cid, _) in enumerate(hits):
                    fused[cid] += 1.0 / (self.config.rrf_k + rank + 1)
            scored = sorted(fused.items(), key=lambda kv: -kv[1])
        out: list[Chunk] = []
        with self._lock:
            for cid, score in scored:
                chunk = self._chunks.get(cid)
                if chunk is None or chunk.path == excl:
                    continue
                out.append(replace(chunk, score=float(score)))
                if len(out) >= k:
                    break
        return out

    def mentions(self, name: str, k: int = 8, exclude: Path | str | None = None) -> list[Chunk]:
        """Up to ``k`` chunks whose text holds the identifier ``name`` (usages and definitions alike;
        the caller finds the lines), ``exclude`` left out."""
        excl = os.path.abspath(exclude) if exclude is not None else None
        ids = self.bm25.containing(name, k, excl)
        with self._lock:
            return [self._chunks[c] for c in ids if c in self._chunks and self._chunks[c].path != excl]

    def definitions(self, name: str) -> list[Symbol]:
        """Definitions of ``name`` (functions, classes, methods, module-level names) across the workspace."""
        with self._lock:
            return [s for syms in self._symbols.get(name, {}).values() for s in syms]

    def symbols_in(self, path: Path | str) -> list[Symbol]:
        """The definitions the index found in one file, in file order."""
        with self._lock:
            return sorted(self._path_symbols.get(os.path.abspath(path), ()), key=lambda s: s.start_line)

    def chunk(self, chunk_id: int) -> Chunk | None:
        with self._lock:
            return self._chunks.get(chunk_id)

    def chunks_for(self, path: Path | str) -> list[Chunk]:
        with self._lock:
            return [self._chunks[c] for c in self._path_chunks.get(os.path.abspath(path), []) if c in self._chunks]

    def stats(self) -> IndexStats:
        with self._lock:
            skipped = Counter(self._walk_skipped)
            skipped.update(self._content_skipped.values())
            return IndexStats(
                files=len(self._digests),
                chunks=len(self._chunks),
                chars=self._chars,
                symbols=self._symbol_count,
                vectors=len(self.vectors) if self.vectors is not None else 0,
                skipped=dict(sorted(skipped.items())),
                last_index_seconds=round(self._last_index_s, 3),
                pending=self._worker.pending if self._worker is not None else 0,
                embedder=self.embedder.name if self.embedder is not None else "none",
                cache_dir=str(self.cache_dir),
            )
