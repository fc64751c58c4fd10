"""Failed update batches are retried (bounded) and a batch's store writes are one transaction."""

from __future__ import annotations

import threading
import time

import pytest

from indexer.store import Store
from indexer import worker as worker_module
from indexer.worker import CoalescingWorker

from .conftest import write
from .fakes import FakeEmbedder


class FlakyEmbedder(FakeEmbedder):
    """Raises on the next ``failures`` calls."""

    def __init__(self):
        super().__init__()
        self.failures = 0

    def embed(self, texts):
        if self.failures:
            self.failures -= 1
            raise RuntimeError("embedder unavailable")
        return super().embed(texts)


def test_update_retried_after_an_embedder_failure(workspace, make_index, tmp_path):
    path = write(workspace, "m3.py", "def old_name():\n    return 1\n")
    embedder = FlakyEmbedder()
    index = make_index(workspace, embedder=embedder)
    index.build()
    write(workspace, "m3.py", "def new_name():\n    return 2\n")
    embedder.failures = 1
    index.touch(path)
    assert index.flush(timeout=30)
    assert [s.name for s in index.symbols_in(path)] == ["new_name"] and not index.definitions("old_name")
    assert index._worker.errors == 1
    index.close()
    reloaded = make_index(workspace, embedder=FakeEmbedder())
    assert [s.name for s in reloaded.symbols_in(path)] == ["new_name"]


def test_worker_gives_up_after_its_retries():
    calls = []

    def handler(batch):
        calls.append(dict(batch))
        raise RuntimeError("always")

    worker = CoalescingWorker(handler, retries=2, backoff_s=0.01)
    try:
        worker.submit("a")
        assert worker.flush(timeout=10)
        assert calls == [{"a": False}] * 3 and worker.errors == 3 and worker.dropped == 1
        assert worker.pending == 0
    finally:
        worker.close()


def test_a_path_submitted_during_a_failed_batch_goes_with_its_new_request():
    calls = []
    started = threading.Event()
    go = threading.Event()

    def handler(batch):
        calls.append(dict(batch))
        if len(calls) == 1:
            started.set()
            go.wait(10)
            raise RuntimeError("first batch fails")

    worker = CoalescingWorker(handler, retries=3, backoff_s=0.01)
    try:
        worker.submit("a")
        worker.submit("b")
        assert started.wait(10)
        worker.submit("a", remove=True)  # while the batch runs
        go.set()
        assert worker.flush(timeout=10)
        # "a" goes once more, as the newer removal; "b" is retried as it was
        assert calls[0] == {"a": False, "b": False}
        assert sorted(calls[1:], key=len) in ([{"a": True}, {"b": False}], [{"a": True, "b": False}])
        assert worker.errors == 1 and worker.dropped == 0
    finally:
        worker.close()


def test_a_batch_writes_and_deletes_in_one_transaction(workspace, make_index, monkeypatch):
    a = write(workspace, "a.py", "def alpha():\n    pass\n")
    b = write(workspace, "b.py", "def beta():\n    pass\n")
    index = make_index(workspace)
    index.build()
    write(workspace, "a.py", "def alpha_edited():\n    pass\n")
    b.unlink()

    def broken(cur, path):
        raise RuntimeError("disk full")

    monkeypatch.setattr(Store, "_delete_path", staticmethod(broken))
    with pytest.raises(RuntimeError):
        index._update_batch({str(a): False, str(b): False})
    monkeypatch.undo()
    # nothing of the batch reached the store (nor memory): a.py is still the old one
    assert index.store.file_states()[str(a)].digest == index._digests[str(a)]
    assert [s.name for s in index.store.symbols() if s.path == str(a)] == ["alpha"]
    assert index.definitions("alpha") and not index.definitions("alpha_edited")


def test_one_file_that_always_fails_is_the_only_one_dropped():
    """A retry runs its paths one at a time: the files that failed only beside a bad one get in."""
    done = []

    def handler(batch):
        if "bad" in batch:
            raise RuntimeError("this file always fails")
        done.extend(batch)

    worker = CoalescingWorker(handler, retries=2, backoff_s=0.01)
    try:
        for path in ("good1", "bad", "good2"):
            worker.submit(path)
        assert worker.flush(timeout=10)
        assert sorted(done) == ["good1", "good2"] and worker.dropped == 1
    finally:
        worker.close()


class _FakeClock:
    def __init__(self):
        self.now = 0.0

    def monotonic(self):
        return self.now


def _wait_until(predicate, deadline_s=20.0):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_each_failed_path_waits_out_its_own_backoff(monkeypatch):
    """A new failure must not pull another path's pending retry forward: "bad" keeps its documented
    backoff (1, 2, 4 here) while "flaky", failing once in between, is retried after its own."""
    clock = _FakeClock()
    monkeypatch.setattr(worker_module, "time", clock)  # the worker's clock only
    bad_at = []  # fake times of the attempts at "bad"
    done = []
    flaky_failed = []

    def handler(batch):
        if "bad" in batch:
            bad_at.append(clock.now)
            raise RuntimeError("this file always fails")
        if "flaky" in batch and not flaky_failed:
            flaky_failed.append(clock.now)
            raise RuntimeError("fails once")
        done.extend(batch)

    worker = CoalescingWorker(handler, retries=3, backoff_s=1.0)

    def advance_to(t):
        clock.now = t
        with worker._cond:  # wake the thread to look at the clock again
            worker._cond.notify_all()

    def retry_queued(path, attempts):
        with worker._cond:
            return path in worker._retry and worker._attempts.get(path) == attempts

    try:
        worker.submit("bad")
        assert _wait_until(lambda: retry_queued("bad", 1))  # tried at 0, due at 1
        advance_to(1.0)
        assert _wait_until(lambda: retry_queued("bad", 2))  # tried at 1, due at 3
        advance_to(1.5)
        worker.submit("flaky")
        assert _wait_until(lambda: retry_queued("flaky", 1))  # tried at 1.5, due at 2.5
        advance_to(2.5)
        assert _wait_until(lambda: "flaky" in done and not worker._busy)
        assert bad_at == [0.0, 1.0]  # not dragged along with "flaky" at 2.5
        assert retry_queued("bad", 2)
        advance_to(3.0)
        assert _wait_until(lambda: retry_queued("bad", 3))  # tried at 3, due at 7
        advance_to(6.9)
        worker.submit("good")  # a batch taken at 6.9 must leave "bad" waiting
        assert _wait_until(lambda: "good" in done and not worker._busy)
        assert bad_at == [0.0, 1.0, 3.0]
        advance_to(7.0)
        assert worker.flush(timeout=20)
        assert bad_at == [0.0, 1.0, 3.0, 7.0] and flaky_failed == [1.5]
        assert sorted(done) == ["flaky", "good"]
        assert worker.dropped == 1 and worker.errors == 5 and worker.pending == 0
    finally:
        worker.close()


def test_a_burst_is_handled_in_bounded_batches_and_pending_counts_the_running_ones(monkeypatch):
    """A checkout of 4,228 files was one batch: the index's write lock held 120 s (an open buffer's edit
    waited as long), 460 MB more for good, and status said 1 pending throughout."""
    monkeypatch.setattr(worker_module, "MAX_BATCH", 10)
    entered, go = threading.Event(), threading.Event()
    sizes: list[int] = []
    pending_inside: list[int] = []

    def handler(batch):
        sizes.append(len(batch))
        if len(sizes) == 1:
            entered.set()
            assert go.wait(10)
        pending_inside.append(worker.pending)

    worker = CoalescingWorker(handler)
    worker.submit("first")
    assert entered.wait(10)  # the worker is busy with "first": the burst piles up
    for i in range(25):
        worker.submit(f"p{i}")
    assert worker.pending == 26
    go.set()
    assert worker.flush(10)
    assert sizes == [1, 10, 10, 5] and pending_inside[1] == 25 and worker.pending == 0
    worker.close()
