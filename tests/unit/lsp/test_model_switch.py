"""A model switch while the old model answers or loads: its answer is dropped, unwanted loads are skipped.

Each test runs as a plain session (its own engine thread) and as a daemon's session (the shared one).
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

import pytest
from lsprotocol import types as t
from pygls.workspace import Workspace

from engine.fake import FakeEngine
from lsp_server import daemon, server
from lsp_server.server import build_server

from .waiting import until


@dataclass
class Gated(FakeEngine):
    """Answers in full once the test opens its gate, whatever its cancel flag (a step that cannot stop)."""

    started: threading.Event = field(default_factory=threading.Event)
    gate: threading.Event = field(default_factory=threading.Event)
    cancels: list = field(default_factory=list)

    def complete(self, request, cancel, spec=None):
        self.cancels.append(cancel)
        self.started.set()
        self.gate.wait(10)
        return super().complete(request, threading.Event())


def settings(text: str) -> dict:
    return {"model": {"target": "fake", "options": {"text": text}}, "completion": {"debounce_ms": 0}}


def session(monkeypatch, tmp_path, make, daemon_session: bool):
    monkeypatch.setattr(server, "make_engine", make)
    monkeypatch.setattr(daemon, "make_engine", make)
    shared = daemon.Shared() if daemon_session else None
    ls = build_server(user_config=tmp_path / "none.toml", shared=shared)
    ls.protocol._workspace = Workspace(tmp_path.as_uri())
    return ls.draftline, shared


def first_load_held():
    """(loads, gate, make): ``make`` records each model it loads; the first load waits for ``gate``."""
    loads: list[str] = []
    gate = threading.Event()

    def make(model):
        loads.append(model.options["text"])
        if len(loads) == 1:
            gate.wait(10)
        return FakeEngine(text=model.options["text"])

    return loads, gate, make


async def settled(app) -> None:
    """The slot is ready, whatever was queued on the engine thread has run, and its result reached the loop."""
    await until(lambda: app.slot.state == "ready")
    await app.scheduler.call(lambda: None)
    await asyncio.sleep(0)


def finish(app, shared) -> None:
    app.close()
    if shared is not None:
        shared.close()


@pytest.mark.parametrize("daemon_session", [False, True], ids=["stdio", "daemon"])
def test_the_old_models_answer_after_a_switch_is_neither_shown_nor_cached(monkeypatch, tmp_path, daemon_session):
    old, new = Gated(text="OLD_MODEL"), FakeEngine(text="NEW_MODEL")
    app, shared = session(monkeypatch, tmp_path, lambda model: {"OLD_MODEL": old, "NEW_MODEL": new}[model.options["text"]],
                          daemon_session)
    uri = (tmp_path / "a.py").as_uri()
    app.ls.workspace.put_text_document(t.TextDocumentItem(uri=uri, language_id="python", version=1, text="x = "))
    here = t.Position(line=0, character=4)

    async def run():
        app.configure(settings("OLD_MODEL"))
        await until(lambda: app.slot.state == "ready")
        asking = asyncio.ensure_future(app.suggest(uri, here))
        assert await asyncio.to_thread(old.started.wait, 10)  # the old model is generating
        app.configure(settings("NEW_MODEL"))
        stopped = old.cancels[-1].is_set()
        old.gate.set()  # it answers in full after the switch
        in_flight = await asking
        await until(lambda: app.slot.state == "ready")
        return stopped, in_flight, await app.suggest(uri, here)

    try:
        stopped, in_flight, after = asyncio.run(run())
    finally:
        finish(app, shared)
    assert stopped  # the switch cancels this session's generations
    assert in_flight is None
    assert after is not None and after[1] == "NEW_MODEL" and app.telemetry.cache_hits == 0


@pytest.mark.parametrize("daemon_session", [False, True], ids=["stdio", "daemon"])
def test_loads_superseded_before_they_start_never_run_and_only_the_latest_installs(monkeypatch, tmp_path,
                                                                                    daemon_session):
    loads, gate, make = first_load_held()  # the first load lasts until every switch below was made
    app, shared = session(monkeypatch, tmp_path, make, daemon_session)

    async def run():
        app.configure(settings("A"))
        await until(lambda: loads == ["A"])  # loading A on the engine thread
        for text in "BCB":
            app.configure(settings(text))
        gate.set()
        await settled(app)

    try:
        asyncio.run(run())
    finally:
        finish(app, shared)
    assert loads == ["A", "B"]  # A had started; B and C were no longer wanted when their turn came
    assert app.slot.state == "ready" and app.slot.completer.engine.text == "B"


@pytest.mark.parametrize("daemon_session", [False, True], ids=["stdio", "daemon"])
def test_switching_back_to_the_model_that_is_loading_keeps_its_load(monkeypatch, tmp_path, daemon_session):
    loads, gate, make = first_load_held()  # the first load lasts until every switch below was made
    app, shared = session(monkeypatch, tmp_path, make, daemon_session)

    async def run():
        app.configure(settings("A"))
        await until(lambda: loads == ["A"])
        app.configure(settings("B"))
        app.configure(settings("A"))  # back to the model whose load is running
        gate.set()
        await settled(app)

    try:
        asyncio.run(run())
    finally:
        finish(app, shared)
    assert loads == ["A"]  # A was neither dropped nor loaded again; B was never loaded
    assert app.slot.state == "ready" and app.slot.completer.engine.text == "A"


def test_switches_made_before_any_load_starts_load_the_last_model_once(monkeypatch, tmp_path):
    loads: list[str] = []
    app, shared = session(monkeypatch, tmp_path, lambda model: loads.append(model.options["text"])
                          or FakeEngine(text=model.options["text"]), False)

    async def run():
        for text in "ABA":  # in one go: no load has started when the last switch is made
            app.configure(settings(text))
        await settled(app)

    try:
        asyncio.run(run())
    finally:
        finish(app, shared)
    assert loads == ["A"]
    assert app.slot.completer.engine.text == "A"


def test_a_load_skipped_for_another_model_runs_again_when_its_model_is_wanted_back(monkeypatch, tmp_path):
    loads: list[str] = []
    app, shared = session(monkeypatch, tmp_path, lambda model: loads.append(model.options["text"])
                          or FakeEngine(text=model.options["text"]), False)

    async def run():
        gate = threading.Event()
        busy = asyncio.ensure_future(app.scheduler.call(lambda: gate.wait(10)))  # the engine thread is taken
        await asyncio.sleep(0)
        app.configure(settings("A"))
        app.configure(settings("B"))
        await asyncio.sleep(0)  # both loads queued behind it
        gate.set()
        # the loop held (as by a long handler) while the engine thread skips A (B is wanted) and loads B
        for _ in range(1000):
            if loads == ["B"]:
                break
            time.sleep(0.01)
        app.configure(settings("A"))  # back to A before A's load has heard it was skipped
        await busy
        await until(lambda: app.slot.state == "ready")

    try:
        asyncio.run(run())
    finally:
        finish(app, shared)
    assert loads == ["B", "A"]
    assert app.slot.completer.engine.text == "A"
