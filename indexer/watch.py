"""Filesystem watching: a watchdog observer feeding debounced touch/remove calls to an index."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Callable, Iterable, Protocol

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

log = logging.getLogger(__name__)

_RELEVANT = {"created", "modified", "closed", "deleted", "moved"}


class IndexSink(Protocol):
    def touch(self, path: Path | str) -> None: ...

    def remove(self, path: Path | str) -> None: ...


_EXCLUDE = os.path.join(".git", "info", "exclude")


class Watcher:
    """Watches ``roots`` recursively and forwards settled changes to ``sink``.

    Events are collected until nothing has arrived for ``debounce_s`` (bounded by
    ``max_delay_s``), then each changed path is touched or removed once.
    ``is_ignored(path)`` filters paths (ignore rules, secrets); anything under
    ``ignore_dirs`` (the cache directory, .git) is dropped outright. ``new_dir(path)`` is called
    before a directory that appeared (made, or moved in) is walked.
    """

    def __init__(
        self,
        roots: Iterable[Path | str],
        sink: IndexSink,
        is_ignored: Callable[[str], bool],
        ignore_dirs: Iterable[Path | str] = (),
        debounce_s: float = 0.15,
        max_delay_s: float = 2.0,
        new_dir: Callable[[str], None] | None = None,
    ):
        self.roots = [os.path.abspath(r) for r in roots]
        # a root that is a symlink is watched at its target (watchdog watches a link it is given without
        # following it: nothing under it was ever reported); events there are named under the root's spelling
        self._real = [(os.path.realpath(r).rstrip(os.sep) + os.sep, r.rstrip(os.sep) + os.sep) for r in self.roots]
        self.sink = sink
        self.is_ignored = is_ignored
        self.ignore_prefixes = tuple(os.path.abspath(d).rstrip(os.sep) + os.sep for d in ignore_dirs)
        self.debounce_s = debounce_s
        self.max_delay_s = max_delay_s
        self.new_dir = new_dir
        # path -> "touch" | "remove" | "touch_dir" | "remove+touch" | "remove+touch_dir" (see _note)
        self._pending: dict[str, str] = {}
        self._first_at = 0.0
        self._last_at = 0.0
        self._cond = threading.Condition()
        self._stop = False
        self._observer = Observer()
        self._thread = threading.Thread(target=self._run, name="draftline-watch", daemon=True)

    # ---- lifecycle ------------------------------------------------------
    def start(self) -> "Watcher":
        """Watch every root that can be watched (one that cannot, a folder gone or the inotify limit, is
        logged and left to the client's file events); raises only when none can, with nothing left running.

        The observer starts first: scheduled before its start, a root that failed then failed the start,
        leaving the roots started before it watched by threads nobody stopped (three threads and an
        inotify instance over a whole tree at each re-index of a workspace with one folder gone)."""
        handler = _Handler(self._on_event)
        self._observer.start()
        error: Exception | None = None
        watched = 0
        for root in self.roots:
            try:
                self._observer.schedule(handler, os.path.realpath(root), recursive=True)
                watched += 1
            except Exception as exc:
                error = exc
                log.warning("not watching %s for changes on disk: %s", root, exc)
        if not watched and error is not None:
            self._observer.stop()
            self._observer.join(5)
            raise error
        self._thread.start()
        return self

    def stop(self) -> None:
        self._observer.stop()
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._observer.join(5)
        self._thread.join(5)

    def __enter__(self) -> "Watcher":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- events -----------------------------------------------------------
    def _dropped(self, path: str) -> bool:
        if (path + os.sep).startswith(self.ignore_prefixes):
            return True
        if f"{os.sep}.git{os.sep}" not in path + os.sep:
            return False
        # but a root's .git/info/exclude: its patterns hide files like a .gitignore at the root
        return not (path.endswith(_EXCLUDE) and path[: -len(_EXCLUDE)].rstrip(os.sep) in self.roots)

    def _named(self, path: str) -> str:
        """An event's path under the root's spelling (the root a link, the event under its target)."""
        for real, named in self._real:
            if real != named and (path + os.sep).startswith(real):
                return named + path[len(real):] if len(path) >= len(real) else named.rstrip(os.sep)
        return path

    def _note(self, path: str, action: str) -> None:
        path = self._named(path) if path else path
        if not path or self._dropped(path):
            return
        now = time.monotonic()
        with self._cond:
            if not self._pending:
                self._first_at = now
            if action in ("touch", "touch_dir") and self._pending.get(path, "").startswith("remove"):
                # something moved away (or deleted) and another thing moved in (or made) in its place
                # within one debounce: a directory's walk only touches what the new one holds and a
                # file's touch only indexes that file, so whatever was there before (a directory's
                # files above all) must be removed first
                action = "remove+" + action
            self._pending[path] = action
            self._last_at = now
            self._cond.notify_all()

    def _on_event(self, event: FileSystemEvent) -> None:
        if event.event_type not in _RELEVANT:
            return
        src = os.fsdecode(event.src_path)
        if event.event_type == "deleted":
            self._note(src, "remove")
        elif event.event_type == "moved":
            self._note(src, "remove")
            dest = os.fsdecode(event.dest_path)
            self._note(dest, "touch_dir" if event.is_directory else "touch")
        elif event.is_directory:
            if event.event_type == "created":
                self._note(src, "touch_dir")
        else:
            self._note(src, "touch")

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._stop)
                if self._stop:
                    return
                while not self._stop:
                    now = time.monotonic()
                    quiet_left = self._last_at + self.debounce_s - now
                    hard_left = self._first_at + self.max_delay_s - now
                    wait = min(quiet_left, hard_left)
                    if wait <= 0:
                        break
                    self._cond.wait(wait)
                batch, self._pending = self._pending, {}
            self._dispatch(batch)

    def _dispatch(self, batch: dict[str, str]) -> None:
        for path, action in batch.items():
            try:
                if action.startswith("remove"):
                    self.sink.remove(path)
                if action.endswith("touch_dir"):
                    if self.new_dir is not None:
                        self.new_dir(path)
                    for dirpath, dirnames, filenames in os.walk(path):
                        dirnames[:] = [d for d in dirnames if not self.is_ignored(os.path.join(dirpath, d) + os.sep)]
                        for name in filenames:
                            full = os.path.join(dirpath, name)
                            if not self.is_ignored(full):
                                self.sink.touch(full)
                elif action.endswith("touch") and not self.is_ignored(path):
                    self.sink.touch(path)
            except Exception:  # a bad event must not kill the watcher thread
                log.exception("watch event for %s failed", path)


class _Handler(FileSystemEventHandler):
    def __init__(self, callback: Callable[[FileSystemEvent], None]):
        super().__init__()
        self._callback = callback

    def on_any_event(self, event: FileSystemEvent) -> None:
        self._callback(event)


def watch_index(index, debounce_s: float | None = None, sink: IndexSink | None = None) -> Watcher:
    """Start a Watcher for an :class:`indexer.Index`'s roots, with its filter and its cache dir.

    The changes go to ``sink`` (default: the index itself).
    """

    def ignored(path: str) -> bool:
        if index.filter.exclude_root(path) is not None:
            return False  # the index re-checks the root with the file's new patterns
        if path.endswith(os.sep):
            return index.filter.path_reason(Path(path.rstrip(os.sep)) / "x") == "ignored"
        # a file the index holds that is now to be skipped (replaced by a link out of the workspace,
        # say) still goes to the index, which drops it
        return index.filter.path_reason(Path(path)) is not None and not index.indexed(path)

    def new_dir(path: str) -> None:
        # the rules cached for a directory of that name before (moved away, say) are not this one's;
        # the index forgets them on its remove(), but a sink other than the index may hand that over later
        index.filter.invalidate(Path(path))

    return Watcher(
        index.roots,
        index if sink is None else sink,
        ignored,
        ignore_dirs=[index.cache_dir],
        debounce_s=index.config.debounce_s if debounce_s is None else debounce_s,
        new_dir=new_dir,
    ).start()
