"""The engine configuration asks for: local (GGUF, HF, the tiny pair), remote, or the fake test engine."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import replace
from typing import Protocol

from engine.types import CompletionRequest, CompletionResult
from lsp_server.config import ModelConfig


class Engine(Protocol):
    def complete(self, request: CompletionRequest, cancel: threading.Event) -> CompletionResult: ...


def make_engine(model: ModelConfig) -> Engine:
    """The engine configuration asks for (slow for real models: call off the event loop)."""
    remote = model.remote
    if remote not in (None, False) and not (isinstance(remote, Mapping) and remote.get("url") == ""):  # url "": off
        from engine.remote import load_remote

        if not isinstance(remote, Mapping) or remote.get("fallback") != "local":
            return load_remote(remote)  # ValueError for a bad table: the server shows it as a load failure
        return load_remote(remote, fallback=make_engine(replace(model, remote=None)))
    if model.target == "fake":
        if model.fake_fail_load:
            raise RuntimeError("fake engine configured to fail loading")
        from engine.fake import FakeEngine

        return FakeEngine(step_s=model.fake_step_s, text=model.fake_text)
    from engine.bundled import resolve

    target, draft, defaults = resolve(model.target, model.draft)
    options = {**defaults, **model.options}
    from engine.engine import load_engine  # torch lives behind this import

    return load_engine(target, draft, **options)
