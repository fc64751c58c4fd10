"""The engine thread: debounce, latest-wins per document, cancel tokens, and the request metrics."""

from __future__ import annotations

import asyncio
import logging
import resource
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from collections import deque
from dataclasses import dataclass, field
from typing import TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


# how long the indexer waits for a running generation, between two files
YIELD_S = 0.25


@dataclass
class SchedulerStats:
    """Counters the scheduler keeps (read by ``draftline/status``)."""

    submitted: int = 0
    started: int = 0  # generations that reached the engine thread
    superseded: int = 0  # dropped before starting: a newer request or an edit came first
    cancelled: int = 0  # $/cancelRequest while waiting or running
    in_flight: int = 0
    max_in_flight: int = 0


class Scheduler:
    """Runs jobs one at a time on a single engine thread; the newest job per key wins.

    A job receives a ``threading.Event`` it must poll between steps. Submitting for a key sets the
    previous job's event; ``cancel(key)`` (an edit) sets it too. The asyncio side only awaits.
    """

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="draftline-engine")
        self._tokens: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self.idle = threading.Event()  # set while no generation runs (the indexer waits for it a moment)
        self.idle.set()
        self.stats = SchedulerStats()

    def cancel(self, key: str) -> None:
        """Stop whatever runs or waits for ``key`` now (called on every edit)."""
        token = self._tokens.get(key)
        if token is not None:
            token.set()

    def cancel_prefix(self, prefix: str) -> None:
        """Stop every job whose key starts with ``prefix`` (a daemon's session that ended: its keys)."""
        for key, token in list(self._tokens.items()):
            if key.startswith(prefix):
                token.set()

    async def submit(self, key: str, job: Callable[[threading.Event], T], debounce_s: float = 0.0) -> T | None:
        """Run ``job`` on the engine thread unless superseded; None when it never started."""
        self.stats.submitted += 1
        token = threading.Event()
        self.cancel(key)
        self._tokens[key] = token
        try:
            if debounce_s > 0:
                await asyncio.sleep(debounce_s)
            if token.is_set():
                self.stats.superseded += 1
                return None
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._executor, self._run, job, token)
        except asyncio.CancelledError:
            token.set()  # the running generation stops at its next step
            self.stats.cancelled += 1
            raise
        finally:
            if self._tokens.get(key) is token:
                del self._tokens[key]

    async def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the engine thread (model loading: the thread that owns the models)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    def _run(self, job: Callable[[threading.Event], T], token: threading.Event) -> T | None:
        with self._lock:
            if token.is_set():
                self.stats.superseded += 1
                return None
            self.stats.started += 1
            self.stats.in_flight += 1
            self.stats.max_in_flight = max(self.stats.max_in_flight, self.stats.in_flight)
            self.idle.clear()
        try:
            return job(token)
        finally:
            with self._lock:
                self.stats.in_flight -= 1
                if not self.stats.in_flight:
                    self.idle.set()

    def yield_to_generation(self, most_s: float = YIELD_S) -> None:
        """Wait (on another thread: the indexer's) while a generation runs, at most ``most_s``: its
        Python then has the GIL to itself. Bounded, so indexing goes on while the user types."""
        self.idle.wait(most_s)

    def close(self) -> None:
        self.idle.set()
        for token in list(self._tokens.values()):
            token.set()
        self._executor.shutdown(wait=False, cancel_futures=True)


@dataclass
class Telemetry:
    """What the server measured (served by ``draftline/status``)."""

    requests: int = 0
    answered: int = 0  # non-empty answers
    empty: int = 0
    stale: int = 0  # computed, but the document moved meanwhile
    engine_cancelled: int = 0  # generations stopped mid-flight by their token
    errors: int = 0
    cache_hits: int = 0
    type_through: int = 0
    shown: int = 0
    accepted: int = 0
    partially_accepted: int = 0
    accepted_chars: int = 0
    latencies_ms: deque[float] = field(default_factory=lambda: deque(maxlen=2000))
    engine_runs: int = 0  # completions the engine ran (cancelled ones included: their prefill happened)
    prompt_tokens: int = 0  # summed over those runs
    recomputed_tokens: int = 0  # prompt tokens whose KV was not reused from the previous run

    def prompt_cache(self) -> dict[str, float]:
        runs = self.engine_runs or 1
        return {"runs": self.engine_runs, "prompt_tokens_mean": round(self.prompt_tokens / runs, 1),
                "recomputed_mean": round(self.recomputed_tokens / runs, 1)}

    def latency(self) -> dict[str, float]:
        data = sorted(self.latencies_ms)
        if not data:
            return {"count": 0, "p50": 0.0, "p99": 0.0}
        pick = lambda q: data[min(len(data) - 1, int(q * len(data)))]  # noqa: E731
        return {"count": len(data), "p50": round(pick(0.5), 3), "p99": round(pick(0.99), 3)}

    def acceptance(self) -> float:
        base = self.shown or self.answered
        return round(self.accepted / base, 4) if base else 0.0


def rss_mb() -> float:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
