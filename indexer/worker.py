"""One background thread that coalesces dirty paths and hands them to a handler in batches."""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

log = logging.getLogger(__name__)


# A burst (a checkout of thousands of files) is handled in batches of at most this many paths: one batch
# of 4,228 held the index's write lock 120 s (an open buffer's edit waited as long) and grew the server by
# 460 MB for good; what comes meanwhile joins the queue behind them.
MAX_BATCH = 256


class CoalescingWorker:
    """``submit(path)`` marks a path dirty; the thread drains every dirty path at once.

    Paths submitted again while a batch runs are simply processed in the next batch, so
    a burst of saves costs one update per path. ``remove=True`` means the path must leave
    the index even if it still exists on disk; a later plain submit clears that.

    A batch whose handler raises is tried again after ``backoff_s``, doubling, at most ``retries``
    times, then logged and dropped; a path submitted again meanwhile goes with its new request instead.
    A retry runs its paths one at a time, so one file that always fails is the only one dropped.
    """

    def __init__(self, handler: Callable[[dict[str, bool]], None], name: str = "draftline-indexer",
                 retries: int = 3, backoff_s: float = 0.5):
        self._handler = handler
        self._dirty: dict[str, bool] = {}
        # failed path -> (remove, monotonic time its retry is due): each path waits out its own backoff
        self._retry: dict[str, tuple[bool, float]] = {}
        self._attempts: dict[str, int] = {}  # path -> failed tries of the request it carries now
        self.retries = retries
        self.backoff_s = backoff_s
        self._cond = threading.Condition()
        self._busy = False
        self._running = 0  # paths in the batches being handled now
        self._stop = False
        self.errors = 0
        self.dropped = 0  # paths given up on after their last retry
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, path: str, remove: bool = False) -> None:
        with self._cond:
            self._dirty[path] = remove
            self._retry.pop(path, None)  # the new request supersedes the failed one
            self._attempts.pop(path, None)
            self._cond.notify_all()

    @property
    def pending(self) -> int:
        with self._cond:
            return len(self._dirty) + len(self._retry) + (max(self._running, 1) if self._busy else 0)

    def flush(self, timeout: float | None = None) -> bool:
        """Block until nothing is dirty, running or waiting for a retry; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._dirty and not self._busy and not self._retry,
                                       timeout=timeout)

    def close(self, timeout: float = 10.0) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout)

    def _next_batch(self) -> list[dict[str, bool]] | None:
        """Wait for dirty paths or due retries and take them (under ``_cond``): the dirty paths as one
        batch, each due retry as a batch of its own; None once stopped."""
        while not self._stop:
            now = time.monotonic()
            due = [p for p, (_, at) in self._retry.items() if at <= now]
            if self._dirty or due:
                batches = [{p: self._retry.pop(p)[0]} for p in due]
                if len(self._dirty) <= MAX_BATCH:
                    if self._dirty:
                        batches.append(self._dirty)
                    self._dirty = {}
                else:  # the rest stays dirty, for the next batch (in the order it came)
                    batches.append({p: self._dirty.pop(p) for p in list(self._dirty)[:MAX_BATCH]})
                return batches
            # nothing to do yet: sleep until the earliest retry falls due (or a submit/stop wakes us)
            wait = min(at for _, at in self._retry.values()) - now if self._retry else None
            self._cond.wait(wait)
        return None

    def _requeue(self, batch: dict[str, bool]) -> None:
        """Queue a failed batch's paths for a retry (under ``_cond``), each after its own backoff."""
        now = time.monotonic()
        for path, remove in batch.items():
            if path in self._dirty:  # submitted again while it ran: that request goes next anyway
                continue
            n = self._attempts.get(path, 0) + 1
            if n > self.retries:
                self._attempts.pop(path, None)
                self.dropped += 1
                log.error("giving up on index update of %s after %d tries", path, n)
                continue
            self._attempts[path] = n
            self._retry[path] = (remove, now + self.backoff_s * 2 ** (n - 1))

    def _run(self) -> None:
        while True:
            with self._cond:
                batches = self._next_batch()
                if batches is None:
                    return
                self._busy, self._running = True, sum(map(len, batches))
            try:
                for batch in batches:
                    self._run_one(batch)
            finally:
                with self._cond:
                    self._busy, self._running = False, 0
                    self._cond.notify_all()

    def _run_one(self, batch: dict[str, bool]) -> None:
        failed = False
        try:
            self._handler(batch)
        except Exception:  # keep serving; the failure is logged with its traceback and retried
            failed = True
            self.errors += 1
            log.exception("index update failed for %d path(s)", len(batch))
        with self._cond:
            if failed:
                self._requeue(batch)
            else:
                for path in batch:
                    self._attempts.pop(path, None)
