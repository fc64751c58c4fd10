"""What the daemon's sessions share: one index per roots (closed with its last user), one engine per model."""

from __future__ import annotations

import asyncio

from lsp_server import daemon
from lsp_server.config import IndexSettings, ModelConfig


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
