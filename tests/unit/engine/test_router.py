"""Multi-model routing: which model answers, time limits, the confidence rule, lazy shared models."""

from __future__ import annotations

import math
import threading
import time

import pytest

from engine.router import Deadline, Model, Route, Router, geometric_confidence, tensor_bytes
from engine.types import CompletionRequest, CompletionResult, CompletionStats
from lsp_server.config import ModelConfig
from lsp_server.engines import make_router


class Clock:
    """Time that passes only when a scripted engine takes a step: no test waits on the real clock."""

    now = 0.0

    def __call__(self) -> float:
        return Clock.now


class Scripted:
    """An engine whose answer, confidence and pace are set by the test; it stops when its flag is set."""

    def __init__(self, name: str, text: str, prob: float | None = 0.9, steps: int = 1, step_s: float = 0.0):
        self.name, self.text, self.prob, self.steps, self.step_s = name, text, prob, steps, step_s
        self.calls: list[CompletionRequest] = []
        self.overrides: dict = {}
        self.forgot = 0

    def complete(self, request, cancel, spec=None):
        self.calls.append(request)
        out = ""
        pieces = self.text.split("\n")
        for i in range(self.steps):
            if cancel.is_set():
                return CompletionResult(out, cancelled=True, stop_reason="cancelled")
            Clock.now += self.step_s
            out = "\n".join(pieces[: max(1, (i + 1) * len(pieces) // self.steps)])  # the text so far, line by line
        stats = CompletionStats()
        if self.prob is not None:
            stats.token_logprobs = [math.log(self.prob)] * 4
        return CompletionResult(out, stop_reason="eos", stats=stats)

    def apply_overrides(self, **kw):
        self.overrides = kw
        return None

    def forget(self):
        self.forgot += 1


def router(line, block, limit_s=10.0, confidence=0.8, lazy_block=True):
    built = []

    def build(engine):
        def make():
            built.append(engine.name)
            return engine
        return make

    now = lambda load: load()  # noqa: E731  # a load runs at once, in the caller: no thread to wait for
    models = {"line": Model("line", "line", build(line), spawn=now)}
    if block is not None:
        models["block"] = Model("block", "block", build(block), spawn=now)
    routes = {"line": Route("line", "line", limit_s), "block": Route("block", "block" if block else "line", limit_s)}
    return Router(models, routes, confidence, clock=Clock()), built


SINGLE = CompletionRequest(prefix="x = ", mode="single-line")
MULTI = CompletionRequest(prefix="def f():\n    ", mode="multi-line")


def test_requests_go_to_their_route_and_models_load_lazily():
    line, block = Scripted("line", "1"), Scripted("block", "a\nb")
    r, built = router(line, block)
    assert built == ["line"]  # the line model at start, the block model on first use
    assert r.complete(SINGLE, threading.Event()).text == "1"
    assert built == ["line"]
    assert r.complete(MULTI, threading.Event()).text == "a\nb"
    assert built == ["line", "block"] and len(line.calls) == 1 and len(block.calls) == 1
    r.complete(MULTI, threading.Event())
    assert built == ["line", "block"]  # loaded once, shared


def test_a_block_past_its_time_limit_answers_with_its_verified_lines():
    block = Scripted("block", "a\nb\nc\nd", steps=4, step_s=0.05)
    r, _ = router(Scripted("line", "L"), block, limit_s=0.12)
    result = r.complete(MULTI, threading.Event())
    assert result.stop_reason == "time" and not result.cancelled
    assert result.text == "a\nb"  # complete lines only (a, b, c were written by 0.15 s), a prefix of the block
    assert r.status()["models"]["block"]["timeouts"] == 1


def test_a_block_with_no_complete_line_by_the_limit_falls_back_to_the_fast_line():
    line = Scripted("line", "fast line")
    block = Scripted("block", "slow", steps=5, step_s=0.05)
    r, _ = router(line, block, limit_s=0.02)
    result = r.complete(MULTI, threading.Event())
    assert result.text == "fast line"
    assert line.calls[-1].mode == "single-line"  # asked for a line, not a block
    assert r.status()["models"]["line"]["fallback_line"] == 1


def test_an_unsure_line_is_asked_of_the_block_model():
    line, block = Scripted("line", "guess", prob=0.5), Scripted("block", "better")
    r, _ = router(line, block)
    assert r.complete(SINGLE, threading.Event()).text == "better"
    sure, _ = router(Scripted("line", "sure", prob=0.95), Scripted("block", "unused"))
    assert sure.complete(SINGLE, threading.Event()).text == "sure"
    off, _ = router(Scripted("line", "guess", prob=0.5), Scripted("block", "x"), confidence=0.0)
    assert off.complete(SINGLE, threading.Event()).text == "guess"  # the rule can be turned off


def test_the_fast_line_stands_when_the_escalation_runs_out_of_time():
    line, block = Scripted("line", "guess", prob=0.5), Scripted("block", "better", steps=5, step_s=0.05)
    r, _ = router(line, block, limit_s=0.03)
    assert r.complete(SINGLE, threading.Event()).text == "guess"
    assert r.status()["models"]["line"]["kept_after_timeout"] == 1


def test_a_block_model_that_cannot_load_leaves_the_line_model_serving():
    line = Scripted("line", "L")
    models = {"line": Model("line", "line", lambda: line),
              "block": Model("block", "block", lambda: (_ for _ in ()).throw(RuntimeError("no such file")),
                             spawn=lambda load: load())}
    r = Router(models, {"line": Route("line", "line", 1), "block": Route("block", "block", 1)})
    assert r.complete(MULTI, threading.Event()).text == "L"
    status = r.status()["models"]["block"]
    assert status["state"] == "failed" and "no such file" in status["error"]


def until(predicate, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_a_block_model_loads_in_the_background_while_the_line_model_answers():
    line, block = Scripted("line", "line writes it"), Scripted("block", "a\nb")
    gate, started = threading.Event(), threading.Event()

    def build_block():
        started.set()
        assert gate.wait(20)  # a large model's load: the engine thread must not wait for it
        return block

    models = {"line": Model("line", "line", lambda: line), "block": Model("block", "block", build_block)}
    r = Router(models, {"line": Route("line", "line", 1), "block": Route("block", "block", 1)})
    r.apply_overrides(drafter="none")
    assert r.complete(MULTI, threading.Event()).text == "line writes it"  # answered while the block model loads
    assert started.wait(20) and r.status()["models"]["block"]["state"] == "loading"
    assert r.complete(MULTI, threading.Event()).text == "line writes it"  # one load, still running
    gate.set()
    until(lambda: r.status()["models"]["block"]["state"] == "ready")
    assert r.complete(MULTI, threading.Event()).text == "a\nb"
    assert block.overrides == {"drafter": "none"}  # the overrides made while it loaded reached it


def test_a_failed_block_model_is_tried_again_after_its_retry_time():
    line, block = Scripted("line", "L"), Scripted("block", "B")
    clock, tries = [0.0], []

    def build_block():
        tries.append(clock[0])
        if len(tries) == 1:
            raise RuntimeError("out of memory")
        return block

    models = {"line": Model("line", "line", lambda: line),
              "block": Model("block", "block", build_block, spawn=lambda load: load(), retry_s=60,
                             clock=lambda: clock[0])}
    r = Router(models, {"line": Route("line", "line", 1), "block": Route("block", "block", 1)})
    assert r.complete(MULTI, threading.Event()).text == "L"
    assert r.status()["models"]["block"]["state"] == "failed"
    clock[0] = 59.0
    assert r.complete(MULTI, threading.Event()).text == "L" and tries == [0.0]  # not before its retry time
    clock[0] = 61.0
    assert r.complete(MULTI, threading.Event()).text == "B" and tries == [0.0, 61.0]
    status = r.status()["models"]["block"]
    assert status["state"] == "ready" and "error" not in status


def test_cancel_passes_through_and_overrides_reach_every_model():
    line, block = Scripted("line", "L"), Scripted("block", "B")
    r, _ = router(line, block)
    cancel = threading.Event()
    cancel.set()
    assert r.complete(MULTI, cancel).cancelled
    r.apply_overrides(drafter="none")
    assert line.overrides == {"drafter": "none"} and block.overrides == {"drafter": "none"}
    r.forget()
    assert line.forgot == 1


def test_deadline_and_confidence_helpers():
    outer = threading.Event()
    d = Deadline(outer, time.perf_counter() + 60)
    assert not d.is_set()
    outer.set()
    assert d.is_set() and not d.expired()
    past = Deadline(threading.Event(), Clock.now - 1, Clock())
    assert past.is_set() and past.expired()
    stats = CompletionStats()
    assert geometric_confidence(stats) is None
    stats.token_logprobs = [math.log(0.5), math.log(0.8)]
    assert geometric_confidence(stats) == pytest.approx(math.sqrt(0.4))


def test_config_builds_shared_lazy_models():
    cfg = ModelConfig(target="fake", options={"text": "same"}, routes={"block": {"time_limit_ms": 50}, "confidence": 0.5})
    r = make_router(cfg)
    assert len(r.models) == 1  # no block model of its own: the line model writes blocks too
    assert r.routes["block"].time_limit_s == pytest.approx(0.05) and r.confidence == 0.5
    assert r.complete(MULTI, threading.Event()).text == "same"
    for bad in ({"lines": {}}, {"confidence": 2}, {"block": {"time_limit_ms": -1}}, {"block": {"targt": "x"}}):
        with pytest.raises(ValueError):
            make_router(ModelConfig(target="fake", routes=bad))


def test_memory_is_counted_per_model(model_dirs):
    from engine.engine import load_engine

    engine = load_engine(str(model_dirs["target"]))
    weights = sum(t.numel() * t.element_size() for t in engine.target.weights.tensors.values())
    assert tensor_bytes(engine) >= weights + engine.target_lm.kv.numel() * engine.target_lm.kv.element_size()


def test_a_transformers_cache_is_counted_once(model_dirs):
    """CachedLM keeps transformers' DynamicCache in `_cache`: its KV is counted, each storage once."""
    from engine.engine import load_engine
    from engine.types import Limits, SpecConfig

    engine = load_engine(str(model_dirs["target"]), backend="transformers", dtype="float32", prompt_slots=0)
    empty = tensor_bytes(engine)
    engine.complete(CompletionRequest(prefix="import json\n", limits=Limits(max_tokens=8)), threading.Event(),
                    spec=SpecConfig(drafter="none"))
    layers = engine.target_lm._cache.layers
    kv = sum(t.untyped_storage().nbytes() for layer in layers for t in (layer.keys, layer.values))
    assert kv > 0 and tensor_bytes(engine) == empty + kv


def test_the_target_reports_each_answer_tokens_log_probability(model_dirs):
    from engine.engine import load_engine
    from engine.types import Limits, SpecConfig

    engine = load_engine(str(model_dirs["target"]))
    request = CompletionRequest(prefix="import json\n\ndef load(path):\n    with open(path) as f:\n        return json.",
                                limits=Limits(max_tokens=24))
    plain = engine.complete(request, threading.Event(), spec=SpecConfig(drafter="none"))
    engine.forget()
    drafted = engine.complete(request, threading.Event(), spec=SpecConfig(drafter="ngram", schedule="fixed", gamma=4))
    assert plain.tokens == drafted.tokens and len(plain.stats.token_logprobs) == len(plain.tokens) > 0
    assert all(lp <= 0 for lp in plain.stats.token_logprobs)
    assert drafted.stats.token_logprobs == pytest.approx(plain.stats.token_logprobs, abs=1e-4)


def test_a_remote_block_route_stops_at_its_time_limit_on_a_stalled_stream():
    """The remote engine's socket watcher waits on its cancel flag: with a route's Deadline as that flag
    it died (no `wait`), and a stalled stream held the engine thread for the whole timeout."""
    from engine.sse_server import SSEServer
    from lsp_server.engines import make_engine

    with SSEServer(mode="stall") as srv:
        srv.stall_after = 1
        cfg = ModelConfig(target="fake", options={"text": "x = 1"},
                          routes={"block": {"remote": {"url": srv.url, "timeout_ms": 20_000}, "time_limit_ms": 100}})
        router = make_engine(cfg)
        started = time.perf_counter()
        router.complete(CompletionRequest(prefix="def f():\n    ", mode="multi-line"), threading.Event())
        assert time.perf_counter() - started < 5.0  # the 100 ms limit, not the 20 s timeout


def test_a_deadline_waits_like_an_event():
    outer = threading.Event()
    now = [0.0]
    d = Deadline(outer, at=1.0, clock=lambda: now[0])
    assert d.wait(0.01) is False  # neither set nor past
    now[0] = 2.0
    assert d.wait(5.0) is True  # past the deadline: returns at once
    outer.set()
    assert Deadline(outer, at=100.0, clock=lambda: 0.0).wait() is True


def test_status_of_a_remote_only_router_does_not_import_torch():
    import subprocess
    import sys

    code = ("import sys\nfrom lsp_server.config import ModelConfig\nfrom lsp_server.engines import make_engine\n"
            "cfg = ModelConfig(remote={'url': 'http://127.0.0.1:9'}, routes={'block': {'remote': {'url': 'http://127.0.0.1:9'}}})\n"
            "r = make_engine(cfg)\nr.status()\nprint('torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_a_block_model_seen_at_any_point_of_its_load_gets_the_overrides():
    published, finish = threading.Event(), threading.Event()

    class Paused(Model):  # the load thread stops right after the engine becomes visible
        def __setattr__(self, name, value):
            super().__setattr__(name, value)
            if name == "engine" and value is not None and threading.current_thread().name == "draftline-route-load":
                published.set()
                finish.wait(20)

    line, block = Scripted("line", "L"), Scripted("block", "a\nb")
    models = {"line": Model("line", "line", lambda: line), "block": Paused("block", "block", lambda: block)}
    r = Router(models, {"line": Route("line", "line", 1), "block": Route("block", "block", 1)})
    r.apply_overrides(drafter="none")  # the monitor rolled the drafter back
    try:
        models["block"].ready()  # a request wanted it: its load starts in the background
        assert published.wait(20)
        assert r.complete(MULTI, threading.Event()).text == "a\nb"  # the engine is visible, its load not done
        assert block.overrides == {"drafter": "none"}
    finally:
        finish.set()
