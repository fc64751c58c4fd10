"""The engine configuration asks for: local (GGUF, HF, the tiny pair), remote, or the fake test engine."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Protocol

from engine.types import CompletionRequest, CompletionResult
from lsp_server.config import ModelConfig


class Engine(Protocol):
    def complete(self, request: CompletionRequest, cancel: threading.Event) -> CompletionResult: ...


def make_engine(model: ModelConfig) -> Engine:
    """The engine configuration asks for (slow for real models: call off the event loop)."""
    if model.routes:
        return make_router(model)
    remote = model.remote
    if remote not in (None, False) and not (isinstance(remote, Mapping) and remote.get("url") == ""):  # url "": off
        from engine.remote import load_remote

        if not isinstance(remote, Mapping) or remote.get("fallback") != "local":
            return load_remote(remote)  # ValueError for a bad table: the server shows it as a load failure
        return load_remote(remote, fallback=make_engine(replace(model, remote=None)))
    if model.target == "fake":
        return make_fake(model.options)
    from engine.bundled import resolve

    target, draft, defaults = resolve(model.target, model.draft)
    options = {**defaults, **model.options}
    from engine.engine import load_engine  # torch lives behind this import

    return load_engine(target, draft, **options)


FAKE_OPTIONS = {"step_s", "text", "fail_load"}


def make_fake(options: Mapping[str, Any]) -> Engine:
    """The FakeEngine (test engine) for ``model.options``: { step_s = seconds per step (cancellation
    tests), text = fixed completion text, fail_load = true (load-failure tests) }. ValueError for any
    other key (the server shows it as a load failure)."""
    if unknown := sorted(set(options) - FAKE_OPTIONS):
        raise ValueError(f"model.options: unknown option(s) {', '.join(map(str, unknown))} for the fake engine; "
                         f"it takes {', '.join(sorted(FAKE_OPTIONS))}")
    step_s, text, fail_load = options.get("step_s", 0.0), options.get("text"), options.get("fail_load", False)
    if isinstance(step_s, bool) or not isinstance(step_s, (int, float)) or step_s < 0:
        raise ValueError(f"model.options.step_s must be a number >= 0, not {step_s!r}")
    if text is not None and not isinstance(text, str):
        raise ValueError(f"model.options.text must be a string, not {text!r}")
    if not isinstance(fail_load, bool):
        raise ValueError(f"model.options.fail_load must be true or false, not {fail_load!r}")
    if fail_load:
        raise RuntimeError("fake engine configured to fail loading")
    from engine.fake import FakeEngine

    return FakeEngine(step_s=float(step_s), text=text)


ROUTE_KEYS = {"target", "draft", "options", "remote", "time_limit_ms"}


def make_router(model: ModelConfig) -> Engine:
    """engine.router.Router over `model.routes`; a route left out is `model`'s own target. ValueError
    for a table it cannot read (the server shows it as a load failure)."""
    from engine.router import DEFAULT_CONFIDENCE, DEFAULT_TIME_LIMIT_MS, ROUTES, Model, Route, Router, route_key

    routes = dict(model.routes or {})
    confidence = routes.pop("confidence", DEFAULT_CONFIDENCE)
    if unknown := sorted(set(routes) - set(ROUTES)):
        raise ValueError(f"model.routes: unknown route(s) {', '.join(unknown)}; routes are {', '.join(ROUTES)} "
                         "(and confidence)")
    if not _number(confidence) or not 0 <= confidence <= 1:
        raise ValueError(f"model.routes.confidence must be in [0, 1], not {confidence!r}")
    own = {"target": model.target, "draft": model.draft, "options": dict(model.options), "remote": model.remote}
    models: dict[str, Model] = {}
    built: dict[str, Route] = {}
    for name in ROUTES:
        table = routes.get(name) or {}
        if not isinstance(table, Mapping) or (bad := sorted(set(table) - ROUTE_KEYS)):
            raise ValueError(f"model.routes.{name}: expected a table with {', '.join(sorted(ROUTE_KEYS))}"
                             + (f", not {', '.join(bad)}" if isinstance(table, Mapping) else ""))
        if table.get("target") is not None or table.get("remote") is not None:  # a model of its own
            spec = {"target": table.get("target") or "", "draft": table.get("draft"),
                    "options": dict(table.get("options") or {}), "remote": table.get("remote")}
        else:  # this table's model, with the route's draft or options
            spec = {**own, "options": {**own["options"], **dict(table.get("options") or {})}}
            if table.get("draft") is not None:
                spec["draft"] = table["draft"]
        key = route_key(spec)
        if key not in models:
            sub = replace(model, target=spec["target"], draft=spec["draft"], options=spec["options"],
                          remote=spec["remote"], routes=None)
            label = _label(sub)
            taken = {m.key for m in models.values()}
            models[key] = Model(key=label if label not in taken else f"{label}#{len(models) + 1}", label=label,
                                build=lambda sub=sub: make_engine(sub))
        limit = table.get("time_limit_ms", DEFAULT_TIME_LIMIT_MS)
        if not _number(limit) or not limit >= 0:  # inf is no limit; nan would be one never reached
            raise ValueError(f"model.routes.{name}.time_limit_ms must be a number >= 0, not {limit!r}")
        built[name] = Route(name, models[key].key, float(limit) / 1000.0)
    by_key = {m.key: m for m in models.values()}
    return Router(by_key, built, float(confidence))


def _number(value: object) -> bool:
    """An int or float, not a bool (TOML's `true` is an int to Python)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _label(model: ModelConfig) -> str:
    from lsp_server.server import model_label

    label = model_label(model)
    return f"{label}+{model.draft}" if model.draft else label
