"""Live rules over sliding windows that roll the engine back when it misbehaves (the seed's table).

| metric                    | healthy  | alert        | action                              |
|---------------------------|----------|--------------|-------------------------------------|
| P99 latency               | < 200 ms | > 300 ms     | gamma = 2 (fixed)                   |
| draft acceptance          | > 60 %   | < 40 %       | one drafter down: hybrid/draft -> ngram -> none |
| memory in use             | < 85 %   | > 95 %       | drop the KV caches (once an episode)|
| output identical to plain | 100 %    | any mismatch | target-only until reset             |
| QPS                       |          |              | reported                            |

A rule enters its degraded state at once at the alert threshold and leaves it only after the metric
stayed within the healthy threshold for ``recover_s`` seconds and ``recover_samples`` judgements in a
row, so values between the two thresholds never flap it. Thresholds: ``[monitor]`` (MonitorConfig).

The server feeds ``observe_completion`` after every engine completion (on the event loop). Actions
that touch the models (``forget()``, the self-check's plain re-run) go through ``runner``, which in
the server posts them to the engine thread; the override swap (``apply_overrides``) is one attribute
assignment and happens at once. Torch-free; the clock and the memory probe are injectable (tests).
"""

from __future__ import annotations

import logging
import math
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from engine.types import DRAFTER_RANK, CompletionRequest, CompletionResult, SpecConfig
from lsp_server.config import MonitorConfig

log = logging.getLogger(__name__)

OK, DEGRADED, NA = "ok", "degraded", "n/a"
AUTO_SELF_CHECK_GPU = 100  # self_check_every = -1 on a GPU engine
AUTO_DEGRADED_GAMMA_GPU = 2  # degraded_gamma = -1 on a GPU engine (the seed's table)
UNCHECKABLE = ("cancelled", "time", "error", "context")  # stop reasons a plain re-run need not repeat

Runner = Callable[[Callable[[], None]], Any]  # runs a function where the engine may be used


def memory_used() -> float | None:
    """The share of this machine's memory in use, 1 - MemAvailable / MemTotal; None where unknown.

    Linux only: elsewhere the free-page counts leave out reclaimable cache and would cry wolf.
    """
    try:
        info: dict[str, int] = {}
        with open("/proc/meminfo") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                if key in ("MemTotal", "MemAvailable"):
                    info[key] = int(rest.split()[0])
        if info.get("MemTotal") and "MemAvailable" in info:
            return 1.0 - info["MemAvailable"] / info["MemTotal"]
    except (OSError, ValueError, IndexError):
        pass
    return None


def p99(values: list[float]) -> float:
    """Nearest-rank 99th percentile (with under 100 values: the largest)."""
    data = sorted(values)
    return data[max(0, math.ceil(0.99 * len(data)) - 1)]


@dataclass
class Recovery:
    """A run of healthy judgements: sustained once it lasted ``recover_s`` and ``recover_samples``."""

    recover_s: float
    recover_samples: int
    since: float | None = None
    count: int = 0

    def healthy(self, now: float) -> bool:
        if self.since is None:
            self.since = now
        self.count += 1
        return now - self.since >= self.recover_s and self.count >= self.recover_samples

    def reset(self) -> None:
        self.since, self.count = None, 0


class Hysteresis:
    """ok -> degraded at once on an alert; degraded -> ok after a sustained healthy run (anything
    not healthy restarts the run)."""

    def __init__(self, recover_s: float, recover_samples: int) -> None:
        self.state = OK
        self.recovery = Recovery(recover_s, recover_samples)

    def judge(self, now: float, alert: bool, healthy: bool) -> bool:
        """True when the state changed."""
        if self.state == OK:
            if alert:
                self.state = DEGRADED
                self.recovery.reset()
                return True
            return False
        if not healthy:
            self.recovery.reset()
            return False
        if self.recovery.healthy(now):
            self.state = OK
            self.recovery.reset()
            return True
        return False


class Monitor:
    """The rules' state machine for one engine, fed per completion; ``status()`` for draftline/status."""

    def __init__(self, engine: Any, cfg: MonitorConfig = MonitorConfig(), *, clock: Callable[[], float] = time.monotonic,
                 memory: Callable[[], float | None] = memory_used, runner: Runner | None = None) -> None:
        self.engine = engine
        self.clock = clock
        self.memory = memory
        self.runner: Runner = runner or (lambda fn: fn())
        self.actionable = callable(getattr(engine, "apply_overrides", None))
        base = getattr(engine, "base_spec", None)
        top = max((DRAFTER_RANK.get(d, 0) for d in (base.drafter, base.single_line_drafter) if d), default=0) \
            if isinstance(base, SpecConfig) else 0
        self.base_spec: SpecConfig | None = base if isinstance(base, SpecConfig) else None
        # the acceptance rule's ladder of drafter caps: None = as configured, then weaker drafters
        self.ladder: list[str | None] = [None] + [d for d in ("ngram", "none") if DRAFTER_RANK[d] < top]
        if top == 0:
            self.ladder = [None]
        if base is None and self.actionable:
            # an engine with one spec per model (engine.router.Router): the drafters are its models', some
            # not loaded yet; a cap never raises a drafter, so the whole ladder is safe, and without it the
            # acceptance rule never acted on a router's models at all ("n/a" at 0 % acceptance)
            self.ladder = [None, "ngram", "none"]
        self._lock = threading.RLock()
        self._cancel = threading.Event()  # stops a self-check in flight on reset
        self.transitions: deque[dict[str, Any]] = deque(maxlen=max(1, MonitorConfig().transitions))
        self.overrides: dict[str, Any] = {"gamma": None, "drafter": None, "target_only": False}
        self.spec = self.base_spec
        self.cfg = cfg
        self._reset(cfg)
        if self.actionable:  # an earlier monitor's overrides on a shared engine do not outlive it
            self.spec = engine.apply_overrides()

    # -- configuration ---------------------------------------------------------------------------
    def reconfigure(self, cfg: MonitorConfig, why: str = "new [monitor] settings") -> None:
        """New thresholds: every rule starts over and the engine runs as configured again."""
        with self._lock:
            self._reset(cfg)
            self._record("all", "", OK, f"reset: {why}", "")
            self._apply()

    def reset(self) -> None:
        """Start over with the same thresholds (the one way out of target-only besides a new config)."""
        self.reconfigure(self.cfg, "asked for")

    def _reset(self, cfg: MonitorConfig) -> None:
        self._cancel.set()
        self._cancel = threading.Event()
        self.cfg = cfg
        if self.transitions.maxlen != max(1, cfg.transitions):
            self.transitions = deque(self.transitions, maxlen=max(1, cfg.transitions))
        now = self.clock()
        self.started = now
        self.generation = getattr(self, "generation", 0) + 1  # a self-check from before a reset is void
        self.window: deque[tuple[float, float]] = deque()  # (time, latency ms) of each completion
        self.drafts: deque[tuple[float, int, int]] = deque()  # (time, proposed, accepted) at this drafter
        self.latency = Hysteresis(cfg.recover_s, cfg.recover_samples)
        self.level = 0
        self.level_since = now
        self.acceptance_recovery = Recovery(cfg.recover_s, cfg.recover_samples)
        self.memory_rule = Hysteresis(cfg.recover_s, cfg.recover_samples)
        self.memory_value: float | None = None
        self.mismatch = False
        self.checks = self.mismatches = self.since_check = 0
        self.check_pending = False
        self.forgets = 0

    def _on_gpu(self) -> bool:
        devices = getattr(self.engine, "devices", None)
        if callable(devices):  # a router: its loaded models' targets (auto gamma was "CPU" for any router)
            return any(kind not in ("cpu", "None") for kind in devices())
        device = getattr(getattr(self.engine, "target", None), "device", None)
        kind = getattr(device, "type", None) or str(device or "cpu")
        return kind not in ("cpu", "None")

    def self_check_every(self) -> int:
        if self.base_spec is None:
            return 0  # no one spec to re-run plain (engine.router.Router: one per model, base_spec None = off)
        every = self.cfg.self_check_every
        if every >= 0:
            return every
        return AUTO_SELF_CHECK_GPU if self._on_gpu() else 0

    def degraded_gamma(self) -> int:
        """The latency rule's gamma; 0 = report only. Auto (-1): 2 on a GPU; report only on the CPU, where
        the p99 is the cold prefill of a new file's prompt, which no draft length changes."""
        gamma = self.cfg.degraded_gamma
        if gamma >= 0:
            return gamma
        return AUTO_DEGRADED_GAMMA_GPU if self._on_gpu() else 0

    # -- observations ----------------------------------------------------------------------------
    def observe_completion(self, completion: Any) -> None:
        """One finished lsp_server.completer.Completion (a cancelled one is not judged)."""
        result = completion.result
        if result is None or result.cancelled:
            return
        request = replace(completion.request, snippets=completion.chunks)  # what the engine was given
        self.observe(completion.timings_ms.get("total", result.stats.total_s * 1e3), sum(result.stats.proposed),
                     sum(result.stats.accepted), request=request, result=result)

    def observe(self, latency_ms: float, proposed: int = 0, accepted: int = 0, *,
                request: CompletionRequest | None = None, result: CompletionResult | None = None) -> None:
        """One completion: judge every rule, apply what changed, post engine-thread work to the runner."""
        work: list[Callable[[], None]] = []
        with self._lock:
            if not self.cfg.enabled:
                return
            now = self.clock()
            self.window.append((now, float(latency_ms)))
            if proposed > 0:
                self.drafts.append((now, int(proposed), int(accepted)))
            self._prune(now)
            self._judge_latency(now)
            self._judge_acceptance(now)
            if self._judge_memory(now) and callable(getattr(self.engine, "forget", None)):
                work.append(self._forget)
            if (check := self._due_check(request, result)) is not None:
                work.append(check)
            self._apply()
        for fn in work:
            self.runner(fn)

    def _prune(self, now: float) -> None:
        horizon = now - self.cfg.window_s
        for window in (self.window, self.drafts):
            while window and window[0][0] < horizon:
                window.popleft()

    # -- the rules -------------------------------------------------------------------------------
    def _p99(self) -> float | None:
        return p99([ms for _, ms in self.window]) if len(self.window) >= max(1, self.cfg.min_samples) else None

    def _judge_latency(self, now: float) -> None:
        value = self._p99()
        if value is None:
            return  # too few completions in the window to tell
        cfg, before = self.cfg, self.latency.state
        if self.latency.judge(now, value > cfg.latency_alert_ms, value < cfg.latency_ok_ms):
            if self.latency.state == DEGRADED:
                why, action = f"p99 {value:.0f} ms > {cfg.latency_alert_ms:.0f} ms", (f"gamma={self.degraded_gamma()}" if self.degraded_gamma() else "reported only")
            else:
                why, action = f"p99 {value:.0f} ms < {cfg.latency_ok_ms:.0f} ms sustained", "gamma as configured"
            self._record("latency", before, self.latency.state, why, action)

    def _acceptance(self) -> tuple[float | None, int]:
        proposed = sum(p for _, p, _ in self.drafts)
        accepted = sum(a for _, _, a in self.drafts)
        return (accepted / proposed if proposed >= max(1, self.cfg.min_proposed) else None), proposed

    def _judge_acceptance(self, now: float) -> None:
        last = len(self.ladder) - 1
        if last == 0:
            return  # nothing drafts: nothing to judge
        rate, _ = self._acceptance()
        cfg = self.cfg
        if rate is not None and rate < cfg.acceptance_alert and self.level < last:
            self._step(now, self.level + 1, f"acceptance {rate:.0%} < {cfg.acceptance_alert:.0%}")
        elif self.level == last:  # drafting is off, so there is no acceptance to see: probe one up
            if now - self.level_since >= cfg.probe_s:
                self._step(now, self.level - 1, f"probe after {cfg.probe_s:.0f} s without drafting")
        elif self.level > 0 and rate is not None:
            if rate <= cfg.acceptance_ok:
                self.acceptance_recovery.reset()
            elif self.acceptance_recovery.healthy(now):
                self._step(now, self.level - 1, f"acceptance {rate:.0%} > {cfg.acceptance_ok:.0%} sustained")

    def _step(self, now: float, level: int, why: str) -> None:
        old, before = self.level, self.drafter_label()
        self.level, self.level_since = level, now
        self.drafts.clear()  # the next drafter is judged on its own drafts
        self.acceptance_recovery.reset()
        self._record("acceptance", DEGRADED if old else OK, DEGRADED if level else OK, why,
                     f"drafter {before} -> {self.drafter_label()}")

    def drafter_label(self, level: int | None = None) -> str:
        cap = self.ladder[self.level if level is None else level]
        if cap is not None:
            return cap
        return self.base_spec.drafter if self.base_spec is not None else "configured"

    def _judge_memory(self, now: float) -> bool:
        """True when an episode starts (drop the KV caches, once)."""
        value = self.memory()
        self.memory_value = value
        if value is None:
            return False
        cfg, before = self.cfg, self.memory_rule.state
        if not self.memory_rule.judge(now, value > cfg.memory_alert, value < cfg.memory_ok):
            return False
        if self.memory_rule.state == DEGRADED:
            self._record("memory", before, DEGRADED, f"{value:.0%} in use > {cfg.memory_alert:.0%}", "drop KV caches")
            return True
        self._record("memory", before, OK, f"{value:.0%} in use < {cfg.memory_ok:.0%} sustained", "")
        return False

    def _forget(self) -> None:
        try:
            self.engine.forget()
            with self._lock:
                self.forgets += 1
        except Exception:
            log.exception("monitor: dropping the KV caches failed")

    def _due_check(self, request: CompletionRequest | None, result: CompletionResult | None) -> Callable[[], None] | None:
        """The plain re-run of this completion, when one is due (every Nth checkable completion)."""
        every = self.self_check_every()
        spec = self.spec
        if every <= 0 or self.mismatch or request is None or result is None or spec is None or not self.actionable:
            return None
        if result.cancelled or result.stop_reason in UNCHECKABLE or spec.temperature > 0:
            return None  # sampling, or a stop a re-run need not hit at the same place
        used = (spec.single_line_drafter or spec.drafter) if request.mode == "single-line" else spec.drafter
        if used == "none":
            return None  # it was plain already
        self.since_check += 1
        if self.since_check < every or self.check_pending:
            return None
        self.check_pending = True
        generation, cancel, plain_spec = self.generation, self._cancel, spec.with_overrides(target_only=True)

        def check() -> None:  # on the engine thread
            try:
                plain = self.engine.complete(request, cancel, spec=plain_spec)
            except Exception:
                log.exception("monitor: the self-check's plain run failed")
                plain = None
            with self._lock:
                if generation != self.generation:
                    return  # reset meanwhile
                self.check_pending = False
                if plain is not None and (plain.cancelled or plain.stop_reason in UNCHECKABLE):
                    return  # try again on the next completion
                self.since_check = 0
                if plain is None:
                    return  # a failing check waits its N completions like any other
                self.checks += 1
                if plain.text != result.text and not self.mismatch:
                    self.mismatches += 1
                    self.mismatch = True
                    why = f"speculative {_clip(result.text)!r} != plain {_clip(plain.text)!r}"
                    self._record("identical", OK, DEGRADED, why, "target-only until reset")
                    self._apply()

        return check

    # -- actions and reporting -------------------------------------------------------------------
    def _apply(self) -> None:
        wanted = {
            "gamma": (self.degraded_gamma() or None) if self.latency.state == DEGRADED else None,
            "drafter": self.ladder[self.level],
            "target_only": self.mismatch,
        }
        if wanted == self.overrides:
            return
        self.overrides = wanted
        if self.actionable:
            self.spec = self.engine.apply_overrides(**wanted)

    def _record(self, rule: str, before: str, after: str, why: str, action: str) -> None:
        entry = {"at": self.clock(), "wall": time.time(), "rule": rule, "from": before, "to": after, "why": why,
                 "action": action if self.actionable or not action else f"{action} (not supported by this engine)"}
        self.transitions.append(entry)
        level = logging.WARNING if after == DEGRADED else logging.INFO
        log.log(level, "monitor %s: %s -> %s (%s)%s", rule, before or "-", after, why,
                f": {entry['action']}" if entry["action"] else "")

    def degraded(self) -> list[str]:
        rules = [("latency", self.latency.state == DEGRADED), ("acceptance", self.level > 0),
                 ("memory", self.memory_rule.state == DEGRADED), ("identical", self.mismatch)]
        return [name for name, bad in rules if bad]

    def qps(self, now: float) -> float:
        span = min(self.cfg.window_s, now - self.started)
        return len(self.window) / span if span > 0 else 0.0

    def status(self) -> dict[str, Any]:
        """The ``monitor`` entry of draftline/status. A client's status bar reads ``state`` ("ok" or
        "degraded") and ``degraded`` (the rules that are)."""
        with self._lock:
            now = self.clock()
            self._prune(now)
            cfg = self.cfg
            value = self._p99()
            rate, proposed = self._acceptance()
            degraded = self.degraded() if cfg.enabled else []
            return {
                "enabled": cfg.enabled,
                "state": DEGRADED if degraded else OK,
                "degraded": degraded,
                "qps": round(self.qps(now), 3),
                "completions": len(self.window),
                "window_s": cfg.window_s,
                "rules": {
                    "latency": {"state": self.latency.state, "p99_ms": None if value is None else round(value, 1),
                                "samples": len(self.window), "ok_ms": cfg.latency_ok_ms,
                                "alert_ms": cfg.latency_alert_ms},
                    "acceptance": {"state": NA if len(self.ladder) == 1 else (DEGRADED if self.level else OK),
                                   "rate": None if rate is None else round(rate, 4), "proposed": proposed,
                                   "drafter": self.drafter_label(),
                                   "ladder": [self.drafter_label(i) for i in range(len(self.ladder))]},
                    "memory": {"state": NA if self.memory_value is None else self.memory_rule.state,
                               "used": None if self.memory_value is None else round(self.memory_value, 4),
                               "kv_drops": self.forgets},
                    "identical": {"state": DEGRADED if self.mismatch else OK, "every": self.self_check_every(),
                                  "checks": self.checks, "mismatches": self.mismatches},
                },
                "overrides": dict(self.overrides),
                "actions": "applied" if self.actionable else "not supported by this engine",
                "transitions": [{**t, "ago_s": round(now - t["at"], 1)} for t in self.transitions],
            }


def _clip(text: str, n: int = 40) -> str:
    return text if len(text) <= n else text[:n] + "…"


_MONITORS: weakref.WeakValueDictionary[int, Monitor] = weakref.WeakValueDictionary()
_REGISTRY_LOCK = threading.Lock()


def monitor_for(engine: Any, cfg: MonitorConfig, runner: Runner | None = None) -> Monitor:
    """The one monitor of ``engine``: a daemon's sessions share engines, and two monitors acting on
    one engine would undo each other's overrides. Kept while a session holds it."""
    with _REGISTRY_LOCK:
        monitor = _MONITORS.get(id(engine))
        if monitor is None or monitor.engine is not engine:
            monitor = Monitor(engine, cfg, runner=runner)
            _MONITORS[id(engine)] = monitor
        elif monitor.cfg != cfg:
            monitor.reconfigure(cfg)
        return monitor
