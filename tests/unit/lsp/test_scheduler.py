"""Scheduler invariants: latest wins, one generation at a time, a cancel stops within one step."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from lsp_server.scheduler import Scheduler


class StepJob:
    """A fake generation of ``steps`` steps that checks its token before each, as the engines do.

    The count that matters is ``steps_after_cancel``: the steps that *began* after the test asked
    for the cancel (``cancel_requested()``, called just before the edit, the newer request or the
    ``$/cancelRequest``). It does not trust the token it is testing: when the scheduler fails to set
    it, every remaining step counts. ``hold`` parks the job inside its first step until the test
    calls ``release()``, so the cancel is asked while exactly one step is in flight, with no race.
    """

    def __init__(self, steps: int = 1000, hold: bool = False, step_s: float = 0.0):
        self.steps, self.step_s = steps, step_s
        self.done_steps, self.steps_after_cancel = 0, 0
        self.started = threading.Event()  # the job is inside its first step
        self.requested = threading.Event()
        self._released = threading.Event()
        if not hold:
            self._released.set()

    def cancel_requested(self) -> None:
        self.requested.set()

    def release(self) -> None:
        self._released.set()

    def __call__(self, cancel: threading.Event) -> str:
        for _ in range(self.steps):
            if cancel.is_set():
                return "cancelled"
            if self.requested.is_set():
                self.steps_after_cancel += 1
            self.started.set()
            if not self._released.wait(30):  # a generous bound: a forgotten release() fails, never hangs
                raise AssertionError("the test never released the job")
            if self.step_s:
                time.sleep(self.step_s)  # a slow step: lets concurrent submissions overlap if they can
            self.done_steps += 1
        return "done"


async def wait_event(event: threading.Event) -> None:
    for _ in range(3000):
        if event.is_set():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("event never set")


@pytest.fixture
def scheduler():
    s = Scheduler()
    yield s
    s.close()


async def test_job_runs_and_returns(scheduler: Scheduler):
    assert await scheduler.submit("a", StepJob(steps=3)) == "done"
    assert scheduler.stats.started == 1 and scheduler.stats.in_flight == 0


async def test_latest_wins_per_document(scheduler: Scheduler):
    first = StepJob(hold=True)
    running = asyncio.ensure_future(scheduler.submit("doc", first))
    await wait_event(first.started)
    first.cancel_requested()
    second = asyncio.ensure_future(scheduler.submit("doc", StepJob(steps=2)))
    await asyncio.sleep(0)  # the second submit runs up to its first await: it has set the first's token
    first.release()
    result = await running
    assert first.steps_after_cancel == 0 and first.done_steps == 1  # only the step in flight finished
    assert result == "cancelled"  # the newer request for the same document set its token
    assert await second == "done"


async def test_superseded_during_debounce_never_starts(scheduler: Scheduler):
    old, new = StepJob(steps=2), StepJob(steps=2)
    a = asyncio.ensure_future(scheduler.submit("doc", old, debounce_s=0.05))
    await asyncio.sleep(0)
    b = asyncio.ensure_future(scheduler.submit("doc", new, debounce_s=0.05))
    assert await a is None and await b == "done"
    assert not old.started.is_set() and scheduler.stats.superseded == 1


async def test_edit_cancel_stops_within_one_step(scheduler: Scheduler):
    job = StepJob(hold=True)
    fut = asyncio.ensure_future(scheduler.submit("doc", job))
    await wait_event(job.started)
    job.cancel_requested()
    scheduler.cancel("doc")
    job.release()
    result = await fut
    assert job.steps_after_cancel == 0 and job.done_steps == 1
    assert result == "cancelled"


async def test_a_sessions_keys_are_cancelled_together_and_no_others(scheduler: Scheduler):
    """A daemon's session that ends stops its own generation (keys "<session>:<uri>"), not another's."""
    job = StepJob(hold=True)
    fut = asyncio.ensure_future(scheduler.submit("1:/a.py", job))
    await wait_event(job.started)
    waiting = asyncio.ensure_future(scheduler.submit("2:/a.py", StepJob(steps=1)))
    await asyncio.sleep(0)
    job.cancel_requested()
    scheduler.cancel_prefix("1:")
    job.release()
    assert await fut == "cancelled" and job.steps_after_cancel == 0
    assert await waiting == "done"  # session 2's request was not touched


async def test_task_cancellation_sets_the_token_and_reraises(scheduler: Scheduler):
    job = StepJob(hold=True)
    fut = asyncio.ensure_future(scheduler.submit("doc", job))
    await wait_event(job.started)
    job.cancel_requested()
    fut.cancel()  # what pygls does on $/cancelRequest
    with pytest.raises(asyncio.CancelledError):
        await fut  # raises as soon as the coroutine handled it, while the job is still held
    job.release()
    other = await scheduler.submit("other", StepJob(steps=1))  # runs once the held job has returned
    assert job.steps_after_cancel == 0 and job.done_steps == 1
    assert other == "done" and scheduler.stats.cancelled == 1  # the thread is free again


async def test_at_most_one_generation_runs(scheduler: Scheduler):
    jobs = [StepJob(steps=4, step_s=0.002) for _ in range(12)]
    results = await asyncio.gather(*(scheduler.submit(f"doc{i}", j) for i, j in enumerate(jobs)))
    assert results == ["done"] * 12
    assert scheduler.stats.max_in_flight == 1 and scheduler.stats.started == 12


def test_the_indexer_waits_for_a_running_generation_and_not_otherwise():
    """The index build's Python competes for the GIL with the engine thread's decode loop: between two
    files it waits (a bounded moment) while a generation runs."""
    scheduler = Scheduler()
    started, release = threading.Event(), threading.Event()

    def job(token):
        started.set()
        release.wait(10)
        return "done"

    async def run():
        task = asyncio.ensure_future(scheduler.submit("doc", job))
        assert await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
        assert not scheduler.idle.is_set()
        waited = threading.Event()

        def indexer():  # another thread, as the index build is
            scheduler.yield_to_generation(10)
            waited.set()

        thread = threading.Thread(target=indexer)
        thread.start()
        assert not waited.wait(0.05)  # held while the generation runs
        release.set()
        assert await task == "done"
        assert await asyncio.get_running_loop().run_in_executor(None, waited.wait, 10)
        thread.join(10)
        assert scheduler.idle.is_set()

    asyncio.run(run())
    scheduler.yield_to_generation(10)  # idle: returns at once (a 10 s wait would time the test out)
    scheduler.close()
