"""Multi-model routing (the seed's "多模型路由"): each request goes to the model that fits it.

Two routes, each a model of its own (a local target with an optional draft, a GGUF file, or a
remote server):

- ``line``: single-line requests, a fast model;
- ``block``: multi-line requests and function bodies, a larger one.

The seed's parameters:

- a time limit per model (``time_limit_ms``, 150 ms by default). On a block that runs past it the
  generation stops (the cancel flag the engine checks between steps), and the answer is the part the
  target has already verified, cut to its complete lines; with no complete line yet, the line model
  answers instead;
- a confidence rule (``confidence``, 0.8 by default): a single line whose tokens the line model's
  own target gave a geometric-mean probability below it is asked of the block model too, within
  the block model's time limit; past it, or with nothing better, the fast line stands.

Models are built on first use (the line route's at start, so the server's "ready" means it can
answer; any other in the background, the line model answering meanwhile) and shared: two routes
naming the same model get one engine. `status()` reports each model:
its state, load time, memory, and what the routes did (requests, time-outs, fall-backs, escalations).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from engine.types import CompletionRequest, CompletionResult, SpecConfig

log = logging.getLogger(__name__)

ROUTES = ("line", "block")
DEFAULT_TIME_LIMIT_MS = 150.0
DEFAULT_CONFIDENCE = 0.8


class Deadline:
    """A cancel flag that is also set once `at` (perf_counter seconds) has passed; the engines only
    ask `is_set()`, between prefill chunks and before every draft and verify step."""

    def __init__(self, outer: threading.Event, at: float, clock: Callable[[], float] = time.perf_counter):
        self.outer, self.at, self.clock = outer, at, clock

    def is_set(self) -> bool:
        return self.outer.is_set() or self.clock() >= self.at

    def expired(self) -> bool:
        return not self.outer.is_set() and self.clock() >= self.at

    def wait(self, timeout: float | None = None) -> bool:
        """threading.Event's wait, the deadline counting as set: a remote engine's socket watcher waits
        on its cancel flag (engine.remote._Watch), and without this it died at once, so neither the
        deadline nor a keystroke shut a stalled stream before its timeout (5 s by default)."""
        left = self.at - self.clock()
        if left > 0:
            wait = left if timeout is None else min(timeout, left)
            # a limit of `inf` (TOML's no-limit) or one past what a lock can wait: OverflowError before
            self.outer.wait(None if wait > threading.TIMEOUT_MAX else wait)
        return self.is_set()


def _in_thread(load: Callable[[], None]) -> None:
    threading.Thread(target=load, name="draftline-route-load", daemon=True).start()


@dataclass
class Model:
    """One engine the routes share, built on first use: the line route's at start (``get``, on the
    engine thread), any other in the background once a request wants it (``ready``), so that loading
    a large block model never holds the engine thread (and every keystroke's answer) for its load; the
    line model answers meanwhile. A failed load is tried again once ``retry_s`` have passed."""

    key: str
    label: str
    build: Callable[[], Any]
    engine: Any = None
    state: str = "not loaded"  # not loaded | loading | ready | failed
    error: str = ""
    load_s: float = 0.0
    counts: dict[str, int] = field(default_factory=lambda: {"requests": 0})
    spawn: Callable[[Callable[[], None]], None] = _in_thread  # how a background load runs
    retry_s: float = 60.0
    clock: Callable[[], float] = time.monotonic
    failed_at: float = 0.0
    fresh: bool = False  # loaded, and the router has not yet given it its overrides
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def get(self) -> Any:
        """The engine, loaded here and now if need be; raises when it cannot load."""
        if self._claim():
            self._load()
        if self.engine is None:
            raise RuntimeError(f"{self.label} failed to load: {self.error}" if self.error else f"{self.label} is loading")
        return self.engine

    def ready(self) -> Any:
        """The engine if it is loaded, else None, and a background load starts unless one runs."""
        if self.engine is None and self._claim():
            self.spawn(self._load)
        return self.engine

    def _claim(self) -> bool:
        """Whether this caller should load the model (no one is, and it has not failed lately)."""
        with self._lock:
            if self.engine is not None or self.state == "loading":
                return False
            if self.state == "failed" and self.clock() - self.failed_at < self.retry_s:
                return False
            self.state = "loading"
            return True

    def _load(self) -> None:
        started = time.perf_counter()
        try:
            engine = self.build()
        except Exception as exc:
            with self._lock:
                self.state, self.error, self.failed_at = "failed", f"{type(exc).__name__}: {exc}", self.clock()
            log.error("route model %s failed to load: %s", self.label, self.error)
            return
        with self._lock:
            # fresh before engine: the engine thread reads them without the lock, and an engine seen
            # without its flag would skip the router's overrides (the monitor's rollback)
            self.fresh, self.error = True, ""
            self.engine = engine
            self.state, self.load_s = "ready", time.perf_counter() - started
        log.info("route model %s loaded in %.2fs", self.label, self.load_s)

    def bump(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1


@dataclass(frozen=True)
class Route:
    name: str
    model: str  # Model.key
    time_limit_s: float


def tensor_bytes(engine: Any) -> int:
    """Bytes of the tensors an engine holds (weights, int8 copies, KV caches), each storage once; 0
    where torch was never imported (a remote-only router holds none, and `draftline/status` runs on
    the server's event loop, where importing torch took a second)."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return 0

    seen: set[int] = set()
    total = 0

    def add(t: Any) -> None:
        nonlocal total
        if isinstance(t, torch.Tensor) and t.numel():
            ptr = t.untyped_storage().data_ptr()
            if ptr not in seen:
                seen.add(ptr)
                total += t.untyped_storage().nbytes()

    def walk(obj: Any, depth: int) -> None:
        if obj is None or depth > 4:
            return
        if isinstance(obj, torch.Tensor):
            add(obj)
        elif isinstance(obj, torch.nn.Module):
            for t in (*obj.parameters(), *obj.buffers()):
                add(t)
        elif isinstance(obj, (list, tuple)):
            for x in obj:
                walk(x, depth + 1)
        elif isinstance(obj, Mapping):
            for x in obj.values():
                walk(x, depth + 1)
        elif hasattr(obj, "__dict__") or hasattr(obj, "__slots__"):
            names = list(getattr(obj, "__dict__", {})) + list(getattr(obj, "__slots__", ()))
            for name in names:
                walk(getattr(obj, name, None), depth + 1)

    for lm in (getattr(engine, "target_lm", None), getattr(engine, "draft_lm", None)):
        walk(lm, 0)
        # CachedLM's DynamicCache (`_cache`): named here so its KV counts however deep the walk
        # reaches; a storage the walk already saw is not added twice
        cache = getattr(lm, "_cache", None)
        for layer in getattr(cache, "layers", ()) or ():
            walk([getattr(layer, "keys", None), getattr(layer, "values", None)], 0)
    walk(getattr(getattr(engine, "slots", None), "kept", None), 0)  # earlier prompts' KV copies (engine.slots)
    return total


def geometric_confidence(stats: Any) -> float | None:
    """exp(mean log p) of the answer's tokens under the target, or None when the engine gave none."""
    logprobs = getattr(stats, "token_logprobs", None)
    if not logprobs:
        return None
    return math.exp(sum(logprobs) / len(logprobs))


class Router:
    """An engine (complete, forget, apply_overrides, status) that sends each request to its route's model."""

    def __init__(self, models: Mapping[str, Model], routes: Mapping[str, Route], confidence: float = DEFAULT_CONFIDENCE,
                 clock: Callable[[], float] = time.perf_counter):
        missing = [r for r in ROUTES if r not in routes]
        if missing:
            raise ValueError(f"routes missing: {', '.join(missing)}")
        self.models, self.routes, self.confidence, self.clock = dict(models), dict(routes), confidence, clock
        self.overrides: dict[str, Any] = {}
        self.base_spec = None  # one spec per model: the monitor's plain self-check stays off
        self._answered = threading.local()  # the model whose answer the last complete() on this thread gave
        self._overrides_lock = threading.Lock()  # the monitor's swap (event loop) vs a fresh model's (engine thread)
        line = self.models[self.routes["line"].model]
        line.get()  # the line model answers from the first request
        line.fresh = False  # no overrides yet

    # -- the engine API ------------------------------------------------------------------------------
    def complete(self, request: CompletionRequest, cancel: threading.Event, spec: SpecConfig | None = None) -> CompletionResult:
        self._answered.model = None
        if request.mode == "single-line":
            return self._line(request, cancel, spec)
        return self._block(request, cancel, spec)

    @property
    def template(self):
        """The prompt template of the model that wrote the last answer on this thread (the completer
        shapes it right after `complete`: whether that model saw the rest of the cursor's line); the
        line route's before any. An escalated line is the block model's: shaped with the line model's
        template, a left-to-right block model's `import os` at `|import json` stayed glued to it."""
        model = getattr(self._answered, "model", None) or self.models[self.routes["line"].model]
        return getattr(model.engine, "template", None)

    def devices(self) -> list[str]:
        """The device type of each loaded model's target ("cpu", "cuda", ...): the monitor's auto
        settings (a GPU engine's) look at these, a router having no target of its own."""
        out = []
        for model in self.models.values():
            device = getattr(getattr(model.engine, "target", None), "device", None)
            if device is not None:
                out.append(getattr(device, "type", None) or str(device))
        return out

    def forget(self) -> None:
        for model in self.models.values():
            if model.engine is not None and callable(getattr(model.engine, "forget", None)):
                model.engine.forget()

    def apply_overrides(self, **overrides: Any) -> SpecConfig | None:
        """The monitor's rollback, on every model that takes it (models loaded later get it then)."""
        with self._overrides_lock:
            self.overrides = overrides
            spec = None
            for model in self.models.values():
                if model.engine is not None and callable(getattr(model.engine, "apply_overrides", None)):
                    spec = model.engine.apply_overrides(**overrides)
            return spec

    def status(self) -> dict[str, Any]:
        models = {}
        for model in self.models.values():
            entry: dict[str, Any] = {"label": model.label, "state": model.state, "load_s": round(model.load_s, 2),
                                     **model.counts}
            if model.error:
                entry["error"] = model.error
            if model.engine is not None:
                try:
                    entry["memory_mb"] = round(tensor_bytes(model.engine) / 2**20, 1)
                except Exception as exc:  # reporting never breaks status
                    entry["memory_mb"] = f"unknown ({exc})"
                if callable(getattr(model.engine, "status", None)):
                    entry["remote"] = model.engine.status()
            models[model.key] = entry
        return {"state": "routing", "confidence": self.confidence,
                "routes": {r.name: {"model": r.model, "time_limit_ms": _limit_ms(r.time_limit_s)}
                           for r in self.routes.values()},
                "models": models}

    # -- routes ----------------------------------------------------------------------------------------
    def _engine(self, route: Route) -> tuple[Model, Any] | None:
        """The route's model and engine; None while it loads (in the background) or after it failed."""
        model = self.models[route.model]
        engine = model.ready()
        if engine is None:
            return None
        if model.fresh:  # loaded since the last overrides went out: it gets them now
            with self._overrides_lock:  # else a swap in between was undone by the older overrides
                model.fresh = False
                if self.overrides and callable(getattr(engine, "apply_overrides", None)):
                    engine.apply_overrides(**self.overrides)
        return model, engine

    def _run(self, route: Route, request: CompletionRequest, cancel: threading.Event, spec: SpecConfig | None,
             limited: bool) -> tuple[CompletionResult | None, bool]:
        """(result, whether the time limit cut it); None when the route's model cannot load."""
        got = self._engine(route)
        if got is None:
            return None, False
        model, engine = got
        model.bump("requests")
        flag: Any = cancel
        if limited and route.time_limit_s > 0:
            flag = Deadline(cancel, self.clock() + route.time_limit_s, self.clock)
        result = engine.complete(request, flag, spec=spec) if spec is not None else engine.complete(request, flag)
        self._answered.model = model  # the last to answer; _line/_block set it again where they keep another
        timed_out = isinstance(flag, Deadline) and result.cancelled and flag.expired()
        if timed_out:
            model.bump("timeouts")
        return result, timed_out

    def _line(self, request: CompletionRequest, cancel: threading.Event, spec: SpecConfig | None) -> CompletionResult:
        line, block = self.routes["line"], self.routes["block"]
        result, _ = self._run(line, request, cancel, spec, limited=False)
        if result is None:  # the line model failed: the block model is all there is
            result, _ = self._run(block, request, cancel, spec, limited=False)
            return result if result is not None else CompletionResult("", stop_reason="error")
        conf = geometric_confidence(result.stats)
        if (result.cancelled or block.model == line.model or self.confidence <= 0 or conf is None
                or conf >= self.confidence):
            return result
        better, timed_out = self._run(block, request, cancel, spec, limited=True)
        if better is not None:  # asked of the block model (not while it loads, or after it failed)
            self.models[line.model].bump("escalated")
        if better is None or better.cancelled or not better.text.strip():
            if timed_out:
                self.models[line.model].bump("kept_after_timeout")
            self._answered.model = self.models[line.model]
            return result  # the fast line stands
        self.models[block.model].bump("answered_escalation")
        return better

    def _block(self, request: CompletionRequest, cancel: threading.Event, spec: SpecConfig | None) -> CompletionResult:
        block, line = self.routes["block"], self.routes["line"]
        result, timed_out = self._run(block, request, cancel, spec, limited=block.model != line.model)
        if result is not None and block.model != line.model and result.stop_reason == "error" \
                and not result.cancelled and not result.text.strip():
            # the block model failed this request (a remote route that is down answers "" with "error"):
            # every block came back empty while the line model stood ready
            self.models[block.model].bump("errors")
            result = None
        if result is None:  # no block model: the line model writes the block
            result, _ = self._run(line, request, cancel, spec, limited=False)
            return result if result is not None else CompletionResult("", stop_reason="error")
        if not timed_out:
            return result
        verified = result.text[: result.text.rfind("\n") + 1] if "\n" in result.text else ""
        if verified.strip():  # the complete lines the target verified before the limit
            self.models[block.model].bump("partial")
            return dataclasses.replace(result, text=verified.rstrip("\n"), cancelled=False, stop_reason="time")
        self.models[line.model].bump("fallback_line")
        fast, _ = self._run(line, dataclasses.replace(request, mode="single-line"), cancel, spec, limited=False)
        return fast if fast is not None else dataclasses.replace(result, text="", cancelled=False, stop_reason="time")


def _limit_ms(seconds: float) -> float | None:
    """A route's time limit for status (JSON): None where it is none (TOML's inf or nan)."""
    return round(seconds * 1000, 1) if math.isfinite(seconds) else None


def route_key(table: Mapping[str, Any]) -> str:
    """Which model a route table names (routes naming the same one share an engine)."""
    import json

    relevant = {k: table.get(k) for k in ("target", "draft", "options", "remote") if table.get(k) not in (None, "", {})}
    return json.dumps(relevant, sort_keys=True, default=str)
