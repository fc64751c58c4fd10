"""What the daemon's sessions share: one index per roots (closed with its last user), one engine per model."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref

from lsprotocol import types as t
from pygls.workspace import Workspace

from engine.fake import FakeEngine
from lsp_server import daemon, server
from lsp_server.config import IndexSettings, ModelConfig
from lsp_server.server import build_server

from .waiting import until


class FakeIndex:
    def __init__(self, roots):
        self.roots, self.closed = roots, False

    def close(self):
        self.closed = True


def test_sessions_on_the_same_roots_share_one_index(monkeypatch, tmp_path):
    opened = []
    monkeypatch.setattr(daemon, "open_index", lambda roots, cfg: opened.append(roots) or FakeIndex(roots))
    reg = daemon.IndexRegistry()
    first = reg.acquire([tmp_path], IndexSettings())
    second = reg.acquire([tmp_path], IndexSettings())
    other = reg.acquire([tmp_path / "x"], IndexSettings())
    assert first is second and other is not first and len(opened) == 2
    reg.release(first)
    assert not first.closed  # the other session still uses it
    reg.release(second)
    assert first.closed and not other.closed
    assert reg.acquire([tmp_path], IndexSettings()) is not first  # reopened for a new user


def test_sessions_share_an_index_whatever_their_overlay_delay_or_option_order(monkeypatch, tmp_path):
    monkeypatch.setattr(daemon, "open_index", lambda roots, cfg: FakeIndex(roots))
    reg = daemon.IndexRegistry()
    first = reg.acquire([tmp_path], IndexSettings(overlay_delay_ms=750, options={"embedder": "none", "rrf_k": 60}))
    same = reg.acquire([tmp_path], IndexSettings(overlay_delay_ms=0, options={"rrf_k": 60, "embedder": "none"}))
    other = reg.acquire([tmp_path], IndexSettings(options={"embedder": "none", "rrf_k": 30}))
    assert same is first and other is not first


def test_one_engine_per_model_loaded_once_on_the_engine_thread(monkeypatch):
    loads = []
    monkeypatch.setattr(daemon, "make_engine", lambda model: loads.append(model) or object())
    shared = daemon.Shared()

    async def run():
        a = ModelConfig(target="fake", options={"text": "a"})
        e1, e2 = await asyncio.gather(shared.engine(a), shared.engine(ModelConfig(target="fake", options={"text": "a"})))
        e3 = await shared.engine(ModelConfig(target="fake", options={"text": "b"}))
        return e1, e2, e3

    try:
        e1, e2, e3 = asyncio.run(run())
    finally:
        shared.close()
    assert e1 is e2 and e3 is not e1 and len(loads) == 2


def test_one_engine_for_one_model_whatever_the_order_of_its_options(monkeypatch):
    loads = []
    monkeypatch.setattr(daemon, "make_engine", lambda model: loads.append(model) or object())
    shared = daemon.Shared()

    async def run():
        one = await shared.engine(ModelConfig(target="tiny", options={"gamma": 2, "drafter": "ngram"}))
        two = await shared.engine(ModelConfig(target="tiny", options={"drafter": "ngram", "gamma": 2}))
        routed = {"line": {"target": "fake", "options": {"text": "a", "step_s": 0}}, "confidence": 0.8}
        three = await shared.engine(ModelConfig(routes=routed))
        four = await shared.engine(ModelConfig(routes={"confidence": 0.8,
                                                       "line": {"options": {"step_s": 0, "text": "a"}, "target": "fake"}}))
        return one, two, three, four

    try:
        one, two, three, four = asyncio.run(run())
    finally:
        shared.close()
    assert one is two and three is four and len(loads) == 2


class Engine(FakeEngine):
    """A FakeEngine whose generations can be held (weakref-able, as every engine is)."""

    def __init__(self, text: str):
        super().__init__(text=text)
        self.started, self.gate = threading.Event(), threading.Event()
        self.gate.set()

    def complete(self, request, cancel, spec=None):
        self.started.set()
        self.gate.wait(10)
        return super().complete(request, threading.Event())  # a step that cannot stop


def daemon_session(shared, tmp_path):
    ls = build_server(user_config=tmp_path / "none.toml", shared=shared)
    ls.protocol._workspace = Workspace(tmp_path.as_uri())
    return ls.draftline


def use(app, text: str) -> None:
    app.configure({"model": {"target": "fake", "options": {"text": text}}, "completion": {"debounce_ms": 0},
                   "index": {"enabled": False}})


def freed(ref: weakref.ref) -> bool:
    gc.collect()
    return ref() is None


def test_an_engine_is_freed_with_its_last_session_and_loaded_again_on_its_next_use(monkeypatch, tmp_path):
    loads: list[str] = []
    engines: dict[str, weakref.ref] = {}

    def make(model):
        loads.append(model.options["text"])
        engine = Engine(model.options["text"])
        engines[engine.text] = weakref.ref(engine)
        return engine

    monkeypatch.setattr(daemon, "make_engine", make)
    shared = daemon.Shared()
    one, two = daemon_session(shared, tmp_path), [daemon_session(shared, tmp_path)]  # two: gone once it ends
    ready = lambda app, text: app.slot.state == "ready" and app.slot.completer.engine.text == text  # noqa: E731

    async def run():
        use(one, "X")
        use(two[0], "X")
        await until(lambda: ready(one, "X") and ready(two[0], "X"))
        assert one.slot.completer.engine is two[0].slot.completer.engine  # one engine for both sessions
        use(one, "Y")
        use(one, "X")  # X -> Y -> X while two holds X: X is still the loaded one
        await until(lambda: ready(one, "X"))
        assert loads == ["X"]  # Y was no longer wanted at its turn, and X is not loaded again
        use(one, "Y")
        await until(lambda: ready(one, "Y"))
        assert not freed(engines["X"])  # two still uses it
        two.pop().close()
        assert freed(engines["X"]) and list(shared.engines().values()) == [1]  # only Y, for one
        use(one, "X")  # back to a model no session held any more: simply loaded again
        await until(lambda: ready(one, "X"))
        assert freed(engines["Y"])
        one.close()
        assert shared.engines() == {}  # the daemon holds none once its sessions ended

    try:
        asyncio.run(run())
    finally:
        one.close()
        for app in two:
            app.close()
        shared.close()
    assert loads == ["X", "Y", "X"]


def test_an_engine_released_during_a_generation_on_it_lives_until_that_generation_ends(monkeypatch, tmp_path):
    made: list[Engine] = []
    monkeypatch.setattr(daemon, "make_engine", lambda model: made.append(Engine(model.options["text"])) or made[-1])
    shared = daemon.Shared()
    app = daemon_session(shared, tmp_path)
    uri = (tmp_path / "a.py").as_uri()
    app.ls.workspace.put_text_document(t.TextDocumentItem(uri=uri, language_id="python", version=1, text="x = "))

    async def run():
        use(app, "OLD")
        await until(lambda: app.slot.state == "ready")
        old = made.pop()
        ref = weakref.ref(old)
        old.gate.clear()
        asking = asyncio.ensure_future(app.suggest(uri, t.Position(line=0, character=4)))
        assert await asyncio.to_thread(old.started.wait, 10)  # generating on the engine thread
        del old
        use(app, "NEW")  # the only session on OLD lets go of it
        assert not any("OLD" in key for key in shared._engines)  # the daemon holds it no more
        assert not freed(ref)  # but the generation still runs on it
        ref().gate.set()
        assert await asking is None  # it ended (its answer is the old model's: dropped)
        await until(lambda: app.slot.state == "ready")
        await app.scheduler.call(lambda: None)
        assert freed(ref)  # and then it is gone

    try:
        asyncio.run(run())
    finally:
        app.close()
        shared.close()


def test_a_daemon_sessions_status_says_its_scheduler_counters_are_the_daemons(tmp_path):
    shared = daemon.Shared()
    one, two = daemon_session(shared, tmp_path), daemon_session(shared, tmp_path)
    alone = build_server(user_config=tmp_path / "none.toml").draftline

    async def run():
        await one.scheduler.submit(one.job_key("file:///a.py"), lambda cancel: None)  # one's generation

    try:
        asyncio.run(run())
        statuses = [one.status(), two.status()]
        mine = alone.status()
    finally:
        for app in (one, two, alone):
            app.close()
        shared.close()
    assert [s["generations"]["started"] for s in statuses] == [1, 1]  # one engine thread: two counts one's too
    assert [s["scheduler_scope"] for s in statuses] == ["daemon", "daemon"]  # and says so
    assert mine["scheduler_scope"] == "session"
