"""The workspace index's lifecycle in the server: opened and built off the loop, watched, fed, shared, closed."""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from indexer.imports import FileTable
from indexer.models import Chunk
from lsp_server.completer import Retriever
from lsp_server.config import IndexSettings
from lsp_server.documents import in_roots

log = logging.getLogger(__name__)


def open_index(roots: Sequence[Path], cfg: IndexSettings) -> Retriever | None:
    """The workspace index (indexer.Index, not yet built), or None when disabled, rootless or unavailable."""
    if not cfg.enabled or not roots:
        return None
    try:
        import indexer
    except ImportError:
        log.info("no indexer available: completing without retrieval")
        return None
    options = _index_options(indexer.IndexConfig, cfg.options)
    try:
        return indexer.Index(list(roots), options)
    except Exception:
        log.exception("index with its embedder failed to open; trying BM25 only")
    try:
        return indexer.Index(list(roots), options, embedder=None)
    except Exception:
        log.exception("index failed to open: completing without retrieval")
        return None


_NO_FILES = FileTable()


MAX_COUNTED_PATHS = 8192  # paths whose own changes generation() leaves out, at most


class IndexHandle:
    """The optional workspace index: opened and built off the loop, fed file events, never fatal.

    It is itself a Retriever (empty until the index is open), so the completer holds it from the start.
    """

    def __init__(self, registry: Any = None) -> None:
        self.registry = registry  # lsp_server.daemon.IndexRegistry: indexes shared between sessions
        self.index: Any = None
        self.state = "none"  # none | opening | building | ready | failed | unavailable
        self._epoch = 0  # bumped by each open and detach
        self._changes = 0  # touch/remove calls, for generation()
        self._changes_by_path: dict[str, int] = {}
        self._unsettled: dict[str, int] = {}  # path -> its last change number, while the index may lack it
        self._changes_lock = threading.Lock()  # counted on the loop, read by generation() on the engine thread
        self._watcher: Any = None  # indexer.watch.Watcher over the open index's roots
        self._watch_lock = threading.Lock()
        self.yield_to: Any = None  # given to each index it opens (Index.yield_to): the engine's generations first

    def open_and_build(self, roots: Sequence[Path], cfg: IndexSettings, progress: Any = None,
                       watch: Any = None) -> None:
        """Blocking: run on a worker thread. A `detach` meanwhile makes this run's result moot.

        ``watch``: where the roots' changes on disk go (an IndexSink: ``touch(path)``, ``remove(path)``,
        called on the watcher's thread); None: nothing watches them.
        """
        with self._watch_lock:
            self._epoch += 1
            epoch = self._epoch
            if cfg.enabled and roots:
                self.state = "opening"  # loading a stored index of a large tree took 32 s: not "none"
        index = self.registry.acquire(roots, cfg) if self.registry is not None else open_index(roots, cfg)
        if index is None:
            if cfg.enabled and roots and epoch == self._epoch:
                self.state = "unavailable"  # it could not open (logged): completions go on without retrieval
            return
        with self._watch_lock:  # against a detach/close now: either it takes this index or we release it
            current = epoch == self._epoch
            if current:
                self.index, self.state = index, "building"
        if not current:  # the roots changed (or the session ended) while it opened
            self.release(index)
            return
        if self.yield_to is not None:
            index.yield_to = self.yield_to
        if watch is not None:  # before the build: a change while it walks is not missed
            self._start_watching(index, watch, epoch)
        try:
            index.build(progress)
            state = "ready"
        except Exception:
            log.exception("indexing failed")
            state = "failed"
        if epoch == self._epoch:
            self.state = state

    def detach(self) -> Any:
        """Forget the current index (the caller closes it); a build still running stops counting.

        Its watcher stops on a thread of its own (joining the observer must not hold up the loop).
        """
        watcher, old = self._take()
        if watcher is not None:
            threading.Thread(target=watcher.stop, name="draftline-watch-stop", daemon=True).start()
        return old

    def _start_watching(self, index: Any, sink: Any, epoch: int) -> None:
        try:
            from indexer.watch import watch_index

            watcher = watch_index(index, sink=sink)
        except Exception as exc:  # e.g. the inotify watch limit: the client's file events still work
            log.warning("not watching %s for changes on disk: %s", [str(r) for r in index.roots], exc)
            return
        with self._watch_lock:
            if epoch == self._epoch:
                self._watcher, watcher = watcher, None
        if watcher is not None:  # detached meanwhile
            watcher.stop()

    def _take(self) -> tuple[Any, Any]:
        """(watcher, index) handed over by this handle, which holds neither afterwards; a build still
        opening or running stops counting."""
        with self._watch_lock:
            self._epoch += 1
            watcher, self._watcher = self._watcher, None
            index, self.index, self.state = self.index, None, "none"
        return watcher, index

    @property
    def watching(self) -> bool:
        return self._watcher is not None

    def key(self, path: str) -> str:
        """``path`` as the index names it: under the spelling of the root that holds it. An editor may
        open a file by another name than the root's (a symlinked root and the file's real path, or the
        reverse): the index keys the file by the root's, and its overlay, its exclusion from its own
        retrieval and its change counts must find it there. A path no root holds is left as it is."""
        roots = getattr(self.index, "roots", None)
        if not path or not roots:
            return path
        return in_roots(path, roots) or path

    def search(self, query: str, k: int, exclude: str | None = None) -> Sequence[Chunk]:
        if self.index is None:
            return []
        return self.index.search(query, k, exclude=self.key(exclude) if exclude else exclude)

    def mentions(self, name: str, k: int, exclude: str | None = None) -> Sequence[Chunk]:
        if self.index is None:
            return []
        return self.index.mentions(name, k, exclude=self.key(exclude) if exclude else exclude)

    def definitions(self, name: str) -> Sequence[Any]:
        return self.index.definitions(name) if self.index is not None else []

    def chunk(self, chunk_id: int) -> Any:
        return self.index.chunk(chunk_id) if self.index is not None else None

    def symbols_in(self, path: str) -> Sequence[Any]:
        return self.index.symbols_in(self.key(path)) if self.index is not None else []

    @property
    def files(self) -> FileTable:
        """The indexed paths by name (import resolution); empty until the index is open."""
        return self.index.files if self.index is not None else _NO_FILES

    def generation(self, path: str) -> tuple[Any, ...]:
        """A value that changes whenever the index may hold new content for files other than ``path``.

        The index applies a change later, on its worker thread: until it has, the value says so (its last
        part) and it moves again once it has, so what was built from the old content meanwhile (digest
        stubs, snippets) is not kept under the value the new content is read under.
        """
        key = os.path.abspath(self.key(path)) if path else ""
        with self._changes_lock:
            changes, own = self._changes, self._changes_by_path.get(key, 0)
        settled = self._settled()  # after reading the count: every change counted so far is applied then
        with self._changes_lock:
            if settled:
                self._unsettled = {p: n for p, n in self._unsettled.items() if n > changes}
            waiting = any(p != key for p in self._unsettled)  # typing in ``path`` itself keeps the value
        return id(self.index), self.state, changes - own, waiting

    def _settled(self) -> bool:
        """Whether the index has applied every change submitted to it (its worker is idle)."""
        flush = getattr(self.index, "flush", None)
        try:
            return not callable(flush) or bool(flush(0))
        except Exception:
            return True

    def touch(self, path: str, text: str | None = None) -> None:
        """``text``: this session's unsaved buffer; None: back to the disk's text (in a daemon, to another
        session's unsaved text where one still has the file open)."""
        index = self.index
        path = self.key(path)
        if index is not None and self.registry is not None and hasattr(self.registry, "overlay"):
            text = self.registry.overlay(index, path, text, id(self))
        self._call("touch", path, text)
        self._count(path)  # after the index has the change: a count it is not yet pending for would read as settled

    def remove(self, path: str) -> None:
        path = self.key(path)
        self._call("remove", path)
        self._count(path)

    def _count(self, path: str) -> None:
        key = os.path.abspath(path)
        with self._changes_lock:
            self._changes += 1
            if len(self._changes_by_path) >= MAX_COUNTED_PATHS and key not in self._changes_by_path:
                # a path's own count only keeps generation() still while that path is typed in: forgetting
                # them all costs each file's caches one rebuild, where keeping them grew a week's paths
                self._changes_by_path.clear()
            self._changes_by_path[key] = self._changes_by_path.get(key, 0) + 1
            self._unsettled[key] = self._changes

    def _call(self, method: str, *args: Any) -> None:
        if self.index is None:
            return
        try:
            getattr(self.index, method)(*args)
        except Exception:
            log.exception("index %s failed for %s", method, args[0])

    def stats(self) -> dict[str, Any]:
        if self.index is None:
            return {"state": self.state}
        try:
            stats = self.index.stats()
            numbers = dataclasses.asdict(stats) if dataclasses.is_dataclass(stats) else dict(stats)
            return {"state": self.state, "watching": self.watching, **numbers}
        except Exception as exc:
            return {"state": "error", "error": str(exc)}

    def release(self, index: Any) -> None:
        """Let go of an index this handle held (closed, or left to the sessions that still share it)."""
        if index is None:
            return
        if self.registry is not None:
            self.registry.release(index)
        elif hasattr(index, "close"):
            index.close()

    def close(self) -> None:
        """Stop watching and let go of the index. The index is taken out before it is released, so a
        second close (a daemon's session closes at ``shutdown`` and again when its connection ends)
        cannot release a shared index once more and close it under the sessions still using it."""
        watcher, index = self._take()
        if watcher is not None:
            watcher.stop()
        self.release(index)


def _index_options(cls: type, options: Mapping[str, Any]) -> Any:
    """The indexer's own config from our ``[index.options]`` table (lists become tuples, paths Paths)."""
    known = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in options.items():
        if key not in known:
            log.warning("index option %r unknown to the indexer", key)
            continue
        if isinstance(value, list):
            value = tuple(value)
        elif isinstance(value, str) and "Path" in str(known[key].type):
            value = Path(value).expanduser()
        kwargs[key] = value
    return cls(**kwargs)
