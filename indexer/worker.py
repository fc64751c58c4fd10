"""One background thread that coalesces dirty paths and hands them to a handler in batches."""

from __future__ import annotations

import logging
import threading
from typing import Callable

log = logging.getLogger(__name__)


class CoalescingWorker:
    """``submit(path)`` marks a path dirty; the thread drains every dirty path at once.

    Paths submitted again while a batch runs are simply processed in the next batch, so
    a burst of saves costs one update per path. ``remove=True`` means the path must leave
    the index even if it still exists on disk; a later plain submit clears that.
    """

    def __init__(self, handler: Callable[[dict[str, bool]], None], name: str = "draftline-indexer"):
        self._handler = handler
        self._dirty: dict[str, bool] = {}
        self._cond = threading.Condition()
        self._busy = False
        self._stop = False
        self.errors = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, path: str, remove: bool = False) -> None:
        with self._cond:
            self._dirty[path] = remove
            self._cond.notify_all()

    @property
    def pending(self) -> int:
        with self._cond:
            return len(self._dirty) + (1 if self._busy else 0)

    def flush(self, timeout: float | None = None) -> bool:
        """Block until nothing is dirty or running; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._dirty and not self._busy, timeout=timeout)

    def close(self, timeout: float = 10.0) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._dirty or self._stop)
                if self._stop:
                    return
                batch, self._dirty = self._dirty, {}
                self._busy = True
            try:
                self._handler(batch)
            except Exception:  # keep serving; the failure is logged with its traceback
                self.errors += 1
                log.exception("index update failed for %d path(s)", len(batch))
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
