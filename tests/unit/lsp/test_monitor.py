"""The monitor's rollback rules, driven by a fake engine, a fake clock and a fake memory probe."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from dataclasses import dataclass

from engine.fake import FakeEngine
from engine.types import CompletionRequest, CompletionResult, CompletionStats, SpecConfig
from lsp_server.config import Config, MonitorConfig, ModelConfig, resolve_config
from lsp_server.monitor import DEGRADED, OK, Monitor, p99

FAST = dict(window_s=10.0, min_samples=5, recover_s=5.0, recover_samples=3, min_proposed=10, probe_s=20.0,
            degraded_gamma=2)  # the seed's action (auto, -1, reports only on a CPU engine: tested below)


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


def make(engine=None, memory=lambda: 0.5, **cfg) -> tuple[Monitor, FakeEngine, Clock]:
    engine = engine or FakeEngine(base_spec=SpecConfig(drafter="hybrid"))
    clock = Clock()
    return Monitor(engine, MonitorConfig(**{**FAST, **cfg}), clock=clock, memory=memory), engine, clock


def feed(mon: Monitor, clock: Clock, n: int, latency_ms: float = 50.0, proposed: int = 0, accepted: int = 0,
         step_s: float = 0.5) -> None:
    for _ in range(n):
        clock.now += step_s
        mon.observe(latency_ms, proposed, accepted)


def test_p99_is_nearest_rank():
    assert p99([1.0, 2.0, 3.0]) == 3.0
    assert p99([float(i) for i in range(1, 201)]) == 198.0


def test_latency_enters_gamma_2_above_300_and_leaves_only_after_a_sustained_recovery(caplog):
    mon, engine, clock = make()
    feed(mon, clock, 4, 500.0)
    assert mon.latency.state == OK  # fewer than min_samples: no judgement yet
    with caplog.at_level(logging.WARNING, logger="lsp_server.monitor"):
        feed(mon, clock, 1, 500.0)
    assert mon.latency.state == DEGRADED
    assert engine.spec.gamma == 2 and engine.spec.schedule == "fixed"
    assert engine.spec.drafter == "hybrid"  # only the latency action
    assert [r.getMessage() for r in caplog.records if "latency" in r.getMessage()][0].startswith(
        "monitor latency: ok -> degraded (p99 500 ms > 300 ms)")

    # between the thresholds (the slow ones aged out, p99 = 250): no way back, however long
    feed(mon, clock, 100, 250.0)
    assert mon.latency.state == DEGRADED and engine.spec.gamma == 2

    # healthy, but not yet for recover_s and recover_samples in a row
    feed(mon, clock, 25, 100.0)  # the 250s age out of the 10 s window after 20 of these
    assert mon.latency.state == DEGRADED
    feed(mon, clock, 10, 100.0)
    assert mon.latency.state == OK
    assert engine.spec == engine.base_spec  # gamma as configured again

    # a blip between the thresholds does not flap it back
    feed(mon, clock, 30, 280.0)
    assert mon.latency.state == OK
    kinds = [(t["rule"], t["to"]) for t in mon.status()["transitions"]]
    assert kinds == [("latency", DEGRADED), ("latency", OK)]


def test_an_unhealthy_value_restarts_the_recovery_run():
    mon, engine, clock = make(window_s=1.0, recover_s=3.0, recover_samples=1, min_samples=1)
    feed(mon, clock, 1, 400.0)
    assert mon.latency.state == DEGRADED
    feed(mon, clock, 5, 100.0)  # healthy from the 3rd on (the 400 is in the window till then)
    feed(mon, clock, 3, 250.0)  # in between: the run starts over
    feed(mon, clock, 8, 100.0)  # healthy again from the 3rd: 2.5 s, where the first run would be 6 s
    assert mon.latency.state == DEGRADED
    feed(mon, clock, 1, 100.0)  # 3.0 s
    assert mon.latency.state == OK


def test_acceptance_steps_the_drafter_down_to_none_and_back_up():
    mon, engine, clock = make()
    assert mon.status()["rules"]["acceptance"]["ladder"] == ["hybrid", "ngram", "none"]
    feed(mon, clock, 3, proposed=10, accepted=8)
    assert engine.spec.drafter == "hybrid"
    feed(mon, clock, 4, proposed=10, accepted=1)  # the window: 70 proposed, 28 accepted = 40 %
    assert engine.spec.drafter == "hybrid"
    feed(mon, clock, 1, proposed=10, accepted=1)  # 80 proposed, 29 accepted: < 40 %
    assert engine.spec.drafter == "ngram" and mon.level == 1
    feed(mon, clock, 1, proposed=5, accepted=0)  # the ngram drafter's own window: too few to judge
    assert engine.spec.drafter == "ngram"
    feed(mon, clock, 1, proposed=5, accepted=0)
    assert engine.spec.drafter == "none" and engine.spec.single_line_drafter == ""

    feed(mon, clock, 39, step_s=0.5)  # nothing drafts now: wait probe_s (20 s), then try ngram again
    assert engine.spec.drafter == "none"
    feed(mon, clock, 1, step_s=0.5)
    assert engine.spec.drafter == "ngram"

    # ngram does well for recover_s / recover_samples: the configured drafter again
    feed(mon, clock, 2, proposed=10, accepted=9)
    assert engine.spec.drafter == "ngram"  # healthy for 0.5 s only
    feed(mon, clock, 10, proposed=10, accepted=9)
    assert engine.spec.drafter == "hybrid" and mon.level == 0
    steps = [t["action"] for t in mon.status()["transitions"]]
    assert steps == ["drafter hybrid -> ngram", "drafter ngram -> none", "drafter none -> ngram",
                     "drafter ngram -> hybrid"]


def test_acceptance_between_the_thresholds_neither_steps_down_nor_up():
    mon, engine, clock = make()
    feed(mon, clock, 1, proposed=10, accepted=2)
    assert mon.level == 1
    feed(mon, clock, 200, proposed=10, accepted=5)  # 50 %: not < 40, not > 60
    assert mon.level == 1 and engine.spec.drafter == "ngram"


def test_acceptance_rule_has_nothing_to_do_without_a_drafter():
    mon, engine, clock = make(FakeEngine(base_spec=SpecConfig(drafter="none")))
    feed(mon, clock, 20, proposed=10, accepted=0)
    assert mon.status()["rules"]["acceptance"]["state"] == "n/a" and engine.spec.drafter == "none"
    mon, engine, clock = make(FakeEngine(base_spec=SpecConfig(drafter="ngram")))
    assert mon.status()["rules"]["acceptance"]["ladder"] == ["ngram", "none"]


def test_memory_drops_the_kv_caches_once_per_episode():
    level = [0.5]
    mon, engine, clock = make(memory=lambda: level[0])
    feed(mon, clock, 3)
    level[0] = 0.97
    feed(mon, clock, 10)
    assert engine.forgets == 1 and mon.status()["rules"]["memory"]["state"] == DEGRADED
    level[0] = 0.90  # better, but not healthy: the episode goes on, no second drop
    feed(mon, clock, 30)
    level[0] = 0.97
    feed(mon, clock, 5)
    assert engine.forgets == 1
    level[0] = 0.5
    feed(mon, clock, 12)  # healthy for 5.5 s, 12 samples
    assert mon.status()["rules"]["memory"]["state"] == OK
    level[0] = 0.99  # a new episode
    feed(mon, clock, 1)
    assert engine.forgets == 2
    assert engine.spec == engine.base_spec  # memory has no override


def test_memory_rule_is_idle_without_a_probe():
    mon, engine, clock = make(memory=lambda: None)
    feed(mon, clock, 10)
    assert mon.status()["rules"]["memory"] == {"state": "n/a", "used": None, "kv_drops": 0}


class DivergingEngine(FakeEngine):
    """Drafting changes the output (like a lossy bf16 verify) once ``diverge`` is set."""

    diverge = False

    def complete(self, request, cancel, spec=None):
        result = super().complete(request, cancel, spec)
        drafter = (spec or self.spec).drafter
        if self.diverge and drafter != "none":
            return CompletionResult(result.text + "!", stop_reason="eos", stats=result.stats)
        return result


def completion(engine, monitor, request):
    result = engine.complete(request, threading.Event())
    stats = CompletionStats(proposed=[4], accepted=[3])
    monitor.observe(20.0, 4, 3, request=request, result=CompletionResult(result.text, stop_reason="eos", stats=stats))
    return result


def test_a_mismatch_with_plain_is_target_only_at_once_until_reset():
    engine = DivergingEngine(text="x = 1", base_spec=SpecConfig(drafter="hybrid"))
    mon, _, clock = make(engine, self_check_every=3)
    request = CompletionRequest(prefix="x = ")
    for _ in range(6):  # two checks, both identical
        clock.now += 1
        completion(engine, mon, request)
    rule = mon.status()["rules"]["identical"]
    assert (rule["state"], rule["checks"], rule["mismatches"]) == (OK, 2, 0)
    assert engine.calls == 8  # 6 completions + 2 plain re-runs

    engine.diverge = True
    for _ in range(3):
        clock.now += 1
        completion(engine, mon, request)
    assert mon.mismatch and engine.spec.drafter == "none" and engine.spec.single_line_drafter == ""
    assert mon.status()["state"] == DEGRADED and mon.status()["degraded"] == ["identical"]
    assert mon.status()["transitions"][-1]["action"] == "target-only until reset"

    calls = engine.calls
    for _ in range(20):  # target-only: nothing to compare, and no recovery on its own
        clock.now += 100
        completion(engine, mon, request)
    assert engine.calls == calls + 20 and engine.spec.drafter == "none"

    mon.reset()
    assert not mon.mismatch and engine.spec == engine.base_spec


def test_self_check_skips_sampling_cancelled_and_plain_completions():
    engine = DivergingEngine(text="y", base_spec=SpecConfig(drafter="hybrid", temperature=0.8))
    engine.diverge = True
    mon, _, clock = make(engine, self_check_every=1)
    for _ in range(5):
        completion(engine, mon, CompletionRequest(prefix="a"))
    assert mon.checks == 0 and not mon.mismatch and engine.calls == 5
    mon, engine, clock = make(FakeEngine(base_spec=SpecConfig(drafter="hybrid", single_line_drafter="none")),
                              self_check_every=1)
    completion(engine, mon, CompletionRequest(prefix="a", mode="single-line"))
    mon.observe(20.0, request=CompletionRequest(prefix="a"), result=CompletionResult("", cancelled=True,
                                                                                        stop_reason="cancelled"))
    assert mon.checks == 0 and engine.calls == 1


def test_self_check_is_off_by_default_on_the_cpu():
    mon, engine, clock = make(self_check_every=-1)
    assert mon.self_check_every() == 0
    engine.target = type("T", (), {"device": type("D", (), {"type": "cuda"})()})()
    assert mon.self_check_every() == 100


def test_no_plain_self_check_on_a_router_whose_models_each_have_their_spec():
    from lsp_server.engines import make_engine

    router = make_engine(ModelConfig(target="fake", options={"text": "a = 1"}, routes={"block": {"options": {"text": "b"}}}))
    assert router.base_spec is None  # engine.router's "off"
    mon = Monitor(router, MonitorConfig(self_check_every=1))
    request = CompletionRequest(prefix="x = ", mode="single-line")
    for _ in range(3):
        completion(router, mon, request)
    assert mon.checks == 0 and mon.self_check_every() == 0 and mon.status()["rules"]["identical"]["every"] == 0


def test_qps_is_completions_per_second_over_the_window():
    mon, engine, clock = make(window_s=60.0)
    assert mon.status()["qps"] == 0.0
    feed(mon, clock, 20, step_s=0.5)  # 20 completions in 10 s
    assert mon.status()["qps"] == 2.0 and mon.status()["completions"] == 20
    clock.now += 100
    assert mon.status()["qps"] == 0.0


def test_runner_gets_the_engine_work_and_disabled_does_nothing():
    posted = []
    engine = FakeEngine(base_spec=SpecConfig(drafter="hybrid"))
    clock = Clock()
    level = [0.99]
    mon = Monitor(engine, MonitorConfig(**FAST), clock=clock, memory=lambda: level[0], runner=posted.append)
    mon.observe(10.0)
    assert engine.forgets == 0 and len(posted) == 1
    posted[0]()
    assert engine.forgets == 1 and mon.status()["rules"]["memory"]["kv_drops"] == 1

    mon.reconfigure(MonitorConfig(**{**FAST, "enabled": False}))
    feed(mon, clock, 50, 900.0, proposed=10, accepted=0)
    status = mon.status()
    assert status["state"] == OK and status["completions"] == 0 and engine.spec == engine.base_spec


def test_a_remote_like_engine_without_hooks_is_monitored_but_not_acted_on():
    class Remote:
        def complete(self, request, cancel):
            return CompletionResult("r")

    mon = Monitor(Remote(), MonitorConfig(**FAST), clock=Clock(), memory=lambda: 0.5)
    for _ in range(6):
        mon.observe(900.0)
    status = mon.status()
    assert status["degraded"] == ["latency"] and status["actions"] == "not supported by this engine"
    assert "not supported" in status["transitions"][-1]["action"]


def test_monitor_config_from_toml_layers(tmp_path):
    user = tmp_path / "config.toml"
    user.write_text("[monitor]\nlatency_alert_ms = 500\nenabled = false\n")
    cfg = resolve_config(user_file=user)
    assert cfg.monitor == MonitorConfig(latency_alert_ms=500.0, enabled=False)
    assert Config().monitor.latency_ok_ms == 200.0 and Config().monitor.acceptance_alert == 0.4


def test_server_feeds_the_monitor_and_status_shows_it(tmp_path):
    from lsprotocol import types as t
    from pygls.workspace import Workspace

    from lsp_server.server import build_server

    ls = build_server(user_config=tmp_path / "none.toml")
    app = ls.draftline
    ls.protocol._workspace = Workspace(tmp_path.as_uri())
    uri = (tmp_path / "a.py").as_uri()
    ls.workspace.put_text_document(t.TextDocumentItem(uri=uri, language_id="python", version=1, text="x = 1\ny = "))

    async def run():
        assert app.status()["monitor"]["state"] == "idle"
        app.config = Config(model=ModelConfig(target="fake"), monitor=MonitorConfig(min_samples=1))
        app.slot.state = "loading"
        await app.load_engine(app.config)
        assert app.slot.state == "ready"
        for _ in range(3):
            assert (await app.suggest(uri, t.Position(line=1, character=4))) is not None
            app.cache = type(app.cache)()  # no cache hits: every request runs the engine
        return app.status()

    try:
        status = asyncio.run(run())
    finally:
        app.close()
    json.dumps(status)  # what draftline/status sends
    monitor = status["monitor"]
    assert monitor["enabled"] and monitor["state"] == OK and monitor["completions"] == 3
    assert monitor["rules"]["latency"]["samples"] == 3 and monitor["qps"] > 0
    assert set(monitor["rules"]) == {"latency", "acceptance", "memory", "identical"}
    assert monitor["overrides"] == {"gamma": None, "drafter": None, "target_only": False}


def test_spec_overrides_cap_the_drafter_and_fix_gamma():
    spec = SpecConfig(drafter="hybrid", single_line_drafter="draft", schedule="adaptive", gamma=5)
    assert spec.with_overrides() == spec
    assert spec.with_overrides(gamma=2) == SpecConfig(drafter="hybrid", single_line_drafter="draft",
                                                      schedule="fixed", gamma=2)
    assert spec.with_overrides(drafter="ngram").drafter == "ngram"
    assert spec.with_overrides(drafter="ngram").single_line_drafter == "ngram"
    assert SpecConfig(drafter="ngram", single_line_drafter="none").with_overrides(drafter="draft") == \
        SpecConfig(drafter="ngram", single_line_drafter="none")  # a cap never raises a drafter
    off = spec.with_overrides(gamma=2, drafter="ngram", target_only=True)
    assert (off.drafter, off.single_line_drafter) == ("none", "none")


def test_latency_on_a_cpu_engine_is_reported_not_acted_on_by_default():
    mon, engine, clock = make(degraded_gamma=-1)  # FakeEngine has no GPU: auto means report only
    feed(mon, clock, 6, 500.0)
    assert mon.latency.state == DEGRADED and engine.spec.gamma == 5  # visible, gamma left alone
    assert mon.degraded_gamma() == 0
