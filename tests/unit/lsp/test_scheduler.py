"""Scheduler invariants: latest wins, one generation at a time, a cancel stops within one step."""

from __future__ import annotations

import asyncio
import threading

import pytest

from lsp_server.scheduler import Scheduler


class StepJob:
    """A generation of ``steps`` steps that checks its token before each, like the engines do."""

    def __init__(self, steps: int = 1000, started: threading.Event | None = None, gate: threading.Event | None = None):
        self.steps, self.done_steps, self.steps_after_cancel = steps, 0, 0
        self.started = started or threading.Event()
        self.gate = gate  # steps wait for it (lets a test hold a generation mid-flight)

    def __call__(self, cancel: threading.Event) -> str:
        self.started.set()
        cancelled_seen = False
        for _ in range(self.steps):
            if cancel.is_set():
                return "cancelled"
            if self.gate is not None:
                self.gate.wait(0.01)
            self.done_steps += 1
            if cancel.is_set() and not cancelled_seen:
                cancelled_seen = True
            elif cancelled_seen:
                self.steps_after_cancel += 1
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
    gate = threading.Event()
    first = StepJob(gate=gate)
    running = asyncio.ensure_future(scheduler.submit("doc", first))
    await wait_event(first.started)
    second = asyncio.ensure_future(scheduler.submit("doc", StepJob(steps=2)))
    assert await running == "cancelled"  # the newer request for the same document set its token
    assert await second == "done"
    assert first.steps_after_cancel == 0


async def test_superseded_during_debounce_never_starts(scheduler: Scheduler):
    old, new = StepJob(steps=2), StepJob(steps=2)
    a = asyncio.ensure_future(scheduler.submit("doc", old, debounce_s=0.05))
    await asyncio.sleep(0)
    b = asyncio.ensure_future(scheduler.submit("doc", new, debounce_s=0.05))
    assert await a is None and await b == "done"
    assert not old.started.is_set() and scheduler.stats.superseded == 1


async def test_edit_cancel_stops_within_one_step(scheduler: Scheduler):
    job = StepJob(gate=threading.Event())
    fut = asyncio.ensure_future(scheduler.submit("doc", job))
    await wait_event(job.started)
    scheduler.cancel("doc")
    assert await fut == "cancelled"
    assert job.steps_after_cancel == 0 and job.done_steps < job.steps


async def test_task_cancellation_sets_the_token_and_reraises(scheduler: Scheduler):
    job = StepJob(gate=threading.Event())
    fut = asyncio.ensure_future(scheduler.submit("doc", job))
    await wait_event(job.started)
    fut.cancel()  # what pygls does on $/cancelRequest
    with pytest.raises(asyncio.CancelledError):
        await fut
    assert scheduler.stats.cancelled == 1
    assert await scheduler.submit("other", StepJob(steps=1)) == "done"  # the thread is free again
    assert job.steps_after_cancel == 0


async def test_at_most_one_generation_runs(scheduler: Scheduler):
    jobs = [StepJob(steps=4, gate=threading.Event()) for _ in range(12)]
    results = await asyncio.gather(*(scheduler.submit(f"doc{i}", j) for i, j in enumerate(jobs)))
    assert results == ["done"] * 12
    assert scheduler.stats.max_in_flight == 1 and scheduler.stats.started == 12
