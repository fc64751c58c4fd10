"""Router defects found by probing: which template shapes an escalated line, a block model that errors
(a remote route that is down), escalations counted that never ran, non-finite time limits, and the
monitor's overrides racing a freshly loaded model's."""

from __future__ import annotations

import json
import math
import threading
from types import SimpleNamespace

from engine.router import Deadline, Model, Route, Router
from engine.types import CompletionRequest, CompletionResult, CompletionStats
from lsp_server.config import CompletionConfig, ModelConfig
from lsp_server.completer import Completer
from lsp_server.engines import make_router

SINGLE = CompletionRequest(prefix="x = ", mode="single-line")
MULTI = CompletionRequest(prefix="def f():\n    ", mode="multi-line")


class Engine:
    """Answers ``text`` with confidence ``prob``; ``error`` answers "" with stop_reason "error" (what the
    remote engine gives when its server is down)."""

    def __init__(self, text: str, prob: float = 0.9, order: str | None = None, error: bool = False, device: str = ""):
        self.text, self.prob, self.error = text, prob, error
        self.template = SimpleNamespace(order=order) if order else None
        if device:
            self.target = SimpleNamespace(device=SimpleNamespace(type=device))
        self.calls: list[CompletionRequest] = []
        self.overrides: dict = {}

    def complete(self, request, cancel, spec=None):
        self.calls.append(request)
        if cancel.is_set():
            return CompletionResult("", cancelled=True, stop_reason="cancelled")
        if self.error:
            return CompletionResult("", stop_reason="error")
        stats = CompletionStats()
        stats.token_logprobs = [math.log(self.prob)] * 3
        text = self.text.split("\n", 1)[0] if request.mode == "single-line" else self.text
        return CompletionResult(text, stop_reason="eos", stats=stats)

    def apply_overrides(self, **kw):
        self.overrides = kw


def now(load):
    load()


def router(line, block, confidence=0.8, block_build=None, limit_s=10.0):
    models = {"line": Model("line", "line", lambda: line, spawn=now),
              "block": Model("block", "block", block_build or (lambda: block), spawn=now)}
    return Router(models, {"line": Route("line", "line", limit_s), "block": Route("block", "block", limit_s)}, confidence)


def test_an_escalated_line_is_shaped_for_the_model_that_wrote_it():
    """The completer shapes an answer by the template's order (whether the model saw the rest of the
    cursor's line). An escalated line is the block model's: a left-to-right block model's `import os`
    at `    |import json` must become a line of its own, not be glued to `import json` because the
    line model (FIM) would have seen that code."""
    line = Engine("import sys", prob=0.3, order="psm")  # unsure: escalated
    block = Engine("import os", order="none")  # left to right: never saw `import json`
    r = router(line, block)
    completer = Completer(r, CompletionConfig())
    request = CompletionRequest(prefix="    ", suffix="import json\n", mode="single-line", language="python")
    done = completer.complete(request, threading.Event())
    assert block.calls and done.result.text == "import os"
    assert done.text == "import os\n    "  # its own line, the cursor's indentation before `import json`

    # the line model's own answer keeps the line model's (FIM) shaping
    sure = router(Engine("import sys", prob=0.95, order="psm"), Engine("x", order="none"))
    assert Completer(sure, CompletionConfig()).complete(request, threading.Event()).text == "import sys"


def test_a_block_route_that_errors_leaves_the_line_model_writing_the_block():
    """A remote block route whose server is down answers "" (stop_reason "error") at once: every
    block request came back empty though the line model was ready."""
    line, block = Engine("a = 1\nb = 2"), Engine("", error=True)
    r = router(line, block)
    result = r.complete(MULTI, threading.Event())
    assert result.text == "a = 1\nb = 2" and not result.cancelled
    assert line.calls[-1].mode == "multi-line"  # asked for the block, as when the block model cannot load
    status = r.status()["models"]
    assert status["block"]["errors"] == 1 and status["line"]["requests"] == 1


def test_a_down_remote_block_route_falls_back_to_the_line_model():
    cfg = ModelConfig(target="fake", options={"text": "x = 1"},
                      routes={"block": {"remote": {"url": "http://127.0.0.1:9", "timeout_ms": 2000}}})
    r = make_router(cfg)
    block = next(m for k, m in r.models.items() if k.startswith("remote:"))
    block.get()  # loaded (a remote engine connects per request)
    result = r.complete(MULTI, threading.Event())
    assert block.counts["requests"] == 1  # the remote route was asked (and its server is not there)
    assert result.text == "x = 1"


def test_a_cancelled_block_is_not_handed_to_the_line_model():
    line, block = Engine("L"), Engine("B")
    r = router(line, block)
    cancel = threading.Event()
    cancel.set()
    assert r.complete(MULTI, cancel).cancelled and line.calls == []


def test_escalations_are_counted_only_when_the_block_model_was_asked():
    def broken():
        raise RuntimeError("no such file")

    line = Engine("guess", prob=0.3)
    r = router(line, None, block_build=broken)
    assert r.complete(SINGLE, threading.Event()).text == "guess"
    status = r.status()["models"]
    assert status["block"]["state"] == "failed" and status["block"]["requests"] == 0
    assert status["line"].get("escalated", 0) == 0  # nothing was escalated: there was no block model

    r2 = router(Engine("guess", prob=0.3), Engine("better"))
    assert r2.complete(SINGLE, threading.Event()).text == "better"
    assert r2.status()["models"]["line"]["escalated"] == 1


def test_an_infinite_time_limit_is_valid_json_in_status():
    """TOML writes `time_limit_ms = inf`; status put `Infinity` in draftline/status (not JSON: a
    JavaScript client's JSON.parse throws)."""
    cfg = ModelConfig(target="fake", routes={"block": {"time_limit_ms": math.inf, "options": {"text": "b"}}})
    r = make_router(cfg)
    status = json.loads(json.dumps(r.status(), allow_nan=False))
    assert status["routes"]["block"]["time_limit_ms"] is None and status["routes"]["line"]["time_limit_ms"] == 150.0
    assert r.complete(MULTI, threading.Event()).text == "b"


def test_a_deadline_at_infinity_waits_like_an_event():
    """Deadline.wait() without a timeout at `inf` asked a lock to wait inf seconds: OverflowError."""
    outer, errors, got = threading.Event(), [], []

    def wait():
        try:
            got.append(Deadline(outer, at=math.inf).wait())
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    outer.set()
    waiter.join(20)
    assert not waiter.is_alive() and errors == [] and got == [True]


def test_the_monitor_swap_is_not_undone_by_a_fresh_models_older_overrides():
    """The engine thread gives a freshly loaded model the router's overrides while the event loop may
    swap in new ones: without one lock, the older set could land last and stay."""
    entered, release = threading.Event(), threading.Event()

    class Slow(Engine):
        def apply_overrides(self, **kw):
            if not entered.is_set():  # the first: the router handing the fresh model its overrides
                entered.set()
                assert release.wait(20)
            super().apply_overrides(**kw)

    line, block = Engine("L"), Slow("a\nb")
    r = router(line, block)
    r.apply_overrides(drafter="ngram")
    worker = threading.Thread(target=lambda: r.complete(MULTI, threading.Event()))
    worker.start()
    assert entered.wait(20)  # the engine thread is handing the block model {"drafter": "ngram"}
    swap = threading.Thread(target=lambda: r.apply_overrides(drafter="none"))  # the monitor steps down again
    swap.start()
    # with the lock it waits for the hand-over (this join times out: never a false failure); without, it is
    # done before it, given 2 s: only a machine that gives a thread no time in 2 s lets that pass unseen
    swap.join(2.0)
    release.set()
    worker.join(20)
    swap.join(20)
    assert block.overrides == {"drafter": "none"} and line.overrides == {"drafter": "none"}


def test_true_and_nan_are_not_numbers_in_the_routes_table():
    """`time_limit_ms = true` ran the block model under a 1 ms limit and `confidence = true` escalated
    every line (bool is an int to Python); `time_limit_ms = nan` (TOML has it) passed the `< 0` check
    and became a limit no elapsed time compares past."""
    import pytest

    for bad in ({"block": {"time_limit_ms": True}}, {"block": {"time_limit_ms": math.nan}}, {"confidence": True},
                {"confidence": False}):
        with pytest.raises(ValueError):
            make_router(ModelConfig(target="fake", routes=bad))
