"""Monitor defects found by probing: its rules on a router (engine.router), whose models each have
their own spec and device; and settings changed mid-degradation."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from engine.fake import FakeEngine
from engine.router import Model, Route, Router
from engine.types import SpecConfig
from lsp_server.config import MonitorConfig, ModelConfig
from lsp_server.engines import make_router
from lsp_server.monitor import DEGRADED, OK, Monitor

FAST = dict(window_s=10.0, min_samples=5, recover_s=5.0, recover_samples=3, min_proposed=10, probe_s=20.0)


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


def feed(mon, clock, n, latency_ms=50.0, proposed=0, accepted=0):
    for _ in range(n):
        clock.now += 0.5
        mon.observe(latency_ms, proposed, accepted)


def routed() -> tuple[Router, FakeEngine, FakeEngine]:
    line, block = FakeEngine(text="a = 1"), FakeEngine(text="b\nc")  # both draft (hybrid, SpecConfig's default)
    now = lambda load: load()  # noqa: E731
    models = {"line": Model("line", "line", lambda: line, spawn=now), "block": Model("block", "block", lambda: block, spawn=now)}
    r = Router(models, {"line": Route("line", "line", 1.0), "block": Route("block", "block", 1.0)})
    r.models["block"].get()
    return r, line, block


def test_low_acceptance_steps_a_routers_drafters_down():
    """A router has no one base spec (base_spec None, which keeps the plain self-check off); the
    acceptance rule's ladder came out empty, so at 0 % acceptance it reported "n/a" and never acted."""
    r, line, block = routed()
    clock = Clock()
    mon = Monitor(r, MonitorConfig(**FAST), clock=clock, memory=lambda: 0.5)
    feed(mon, clock, 1, proposed=10, accepted=0)  # min_proposed: 10
    assert mon.status()["rules"]["acceptance"]["state"] == DEGRADED
    assert line.spec.drafter == "ngram" and block.spec.drafter == "ngram"
    feed(mon, clock, 1, proposed=10, accepted=0)
    assert line.spec.drafter == "none" and block.spec.drafter == "none"
    assert mon.self_check_every() == 0  # still no plain self-check on a router

    mon.reset()
    assert line.spec == line.base_spec and block.spec == block.base_spec


def test_a_router_built_from_config_is_judged_too():
    r = make_router(ModelConfig(target="fake", options={"text": "a = 1"}, routes={"block": {"options": {"text": "b"}}}))
    clock = Clock()
    mon = Monitor(r, MonitorConfig(**FAST), clock=clock, memory=lambda: 0.5)
    assert mon.status()["rules"]["acceptance"]["ladder"] == ["configured", "ngram", "none"]
    feed(mon, clock, 1, proposed=50, accepted=5)
    line = r.models[r.routes["line"].model].engine
    assert line.spec.drafter == "ngram"


def test_auto_gamma_on_a_router_of_gpu_models():
    """degraded_gamma = -1 means 2 on a GPU engine: a router (no target of its own) counted as a CPU one."""
    r, line, block = routed()
    clock = Clock()
    mon = Monitor(r, MonitorConfig(**{**FAST, "degraded_gamma": -1}), clock=clock, memory=lambda: 0.5)
    assert mon.degraded_gamma() == 0  # CPU models (FakeEngine has no target): report only
    line.target = block.target = SimpleNamespace(device=SimpleNamespace(type="cuda"))
    assert mon.degraded_gamma() == 2
    feed(mon, clock, 6, 900.0)
    assert mon.latency.state == DEGRADED and line.spec.gamma == 2 and block.spec.gamma == 2


def test_disabling_mid_degradation_restores_the_engine_and_reenabling_starts_clean():
    engine = FakeEngine(base_spec=SpecConfig(drafter="hybrid"))
    clock = Clock()
    mon = Monitor(engine, MonitorConfig(**{**FAST, "degraded_gamma": 2}), clock=clock, memory=lambda: 0.5)
    feed(mon, clock, 6, 900.0, proposed=10, accepted=0)
    assert engine.spec.gamma == 2 and engine.spec.drafter != "hybrid"
    mon.reconfigure(MonitorConfig(**{**FAST, "degraded_gamma": 2, "enabled": False}))
    assert engine.spec == engine.base_spec and mon.status()["degraded"] == []
    feed(mon, clock, 20, 900.0, proposed=10, accepted=0)  # ignored while off
    assert engine.spec == engine.base_spec
    mon.reconfigure(MonitorConfig(**{**FAST, "degraded_gamma": 2}))
    assert mon.status()["completions"] == 0 and mon.status()["state"] == OK
