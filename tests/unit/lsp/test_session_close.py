"""A session's close: once, with its buffers out of the (possibly shared) index and no re-index left pending."""

from __future__ import annotations

import asyncio
from pathlib import Path

from pygls.workspace import TextDocument

from lsp_server import metrics
from lsp_server.index_handle import IndexHandle
from lsp_server.server import build_server


class RecordingIndex:
    """Stands in for the session's IndexHandle: what reached the index, and how often it was closed."""

    def __init__(self) -> None:
        self.touches: list[tuple[str, str | None]] = []
        self.closed = 0

    def touch(self, path: str, text: str | None = None) -> None:
        self.touches.append((path, text))

    def close(self) -> None:
        self.closed += 1


def test_close_drops_the_sessions_buffers_cancels_pending_ones_and_runs_once(tmp_path: Path):
    ls = build_server()
    app = ls.draftline
    app.index = index = RecordingIndex()
    opened, typed, closed = (tmp_path / name for name in ("opened.py", "typed.py", "closed.py"))
    app.document = lambda uri: TextDocument(uri, "typed later")  # what the overlay timer would index
    delay_s = app.config.index.overlay_delay_ms / 1e3

    async def session() -> None:
        app.edited(opened.as_uri(), "unsaved")  # didOpen: overlaid at once
        app.edited(closed.as_uri(), "gone")
        app.index_touch(closed.as_uri(), None)  # didClose: back to the disk already
        app.edited(typed.as_uri(), "typing", immediate=False)  # didChange: overlaid once typing pauses
        app.close()
        app.close()  # the daemon closes a session again when its connection ends
        await asyncio.sleep(delay_s + 0.2)  # past the typed buffer's overlay timer

    asyncio.run(session())
    assert index.touches == [(str(opened), "unsaved"), (str(closed), "gone"), (str(closed), None), (str(opened), None)]
    assert index.closed == 1


class CountingRegistry:
    def __init__(self) -> None:
        self.released: list[object] = []

    def release(self, index: object) -> None:
        self.released.append(index)


def test_a_handle_releases_its_shared_index_once_however_often_it_closes():
    registry = CountingRegistry()
    handle = IndexHandle(registry)
    shared = object()
    handle.index, handle.state = shared, "ready"
    handle.close()
    handle.close()
    assert registry.released == [shared]  # a second release would close it under the other sessions
    assert handle.index is None and handle.search("anything", 3) == []


def test_a_closed_session_leaves_the_metrics_at_once():
    ls = build_server()  # held here: a reference cycle would keep it anyway until a full GC
    app = ls.draftline
    assert any(session is app for session in metrics._LIVE.values())
    app.close()
    assert not any(session is app for session in metrics._LIVE.values())  # no longer exported as live


def test_a_session_leaving_a_file_another_edits_leaves_that_sessions_text_in_the_shared_index(monkeypatch, tmp_path):
    from lsp_server import daemon
    from lsp_server.config import IndexSettings

    shared = RecordingIndex()
    monkeypatch.setattr(daemon, "open_index", lambda roots, cfg: shared)
    registry = daemon.IndexRegistry()
    one, two = IndexHandle(registry), IndexHandle(registry)
    for handle in (one, two):
        handle.index, handle.state = registry.acquire([tmp_path], IndexSettings()), "ready"
    path = str(tmp_path / "both.py")
    one.touch(path, "one's text")
    two.touch(path, "two's text")
    one.touch(path, None)  # one closes its buffer: two still has the file open, unsaved
    two.touch(path, "two's newer text")
    one.touch(path, "one again")
    two.touch(path, None)  # two saves: one's buffer is the latest unsaved text left
    one.touch(path, None)  # and once no session holds the file, the disk's text
    assert shared.touches == [(path, "one's text"), (path, "two's text"), (path, "two's text"),
                              (path, "two's newer text"), (path, "one again"), (path, "one again"), (path, None)]
    one.close()
    two.close()
    assert shared.closed == 1 and registry._overlays == {}


def test_a_handle_says_opening_while_a_stored_index_loads(tmp_path):
    """A 20k-file tree's stored index took 32 s to load, and status said "none" all that time."""
    from lsp_server.config import IndexSettings

    seen: list[str] = []

    class SlowRegistry(CountingRegistry):
        def acquire(self, roots, cfg):
            seen.append(handle.state)  # while it loads
            return None  # and then fails to open

    handle = IndexHandle(SlowRegistry())
    handle.open_and_build([tmp_path], IndexSettings())
    assert seen == ["opening"] and handle.state == "unavailable"


def test_a_closed_stdout_stops_the_sending_after_the_first_broken_pipe(tmp_path):
    """The client closed its end of the pipe: each message after the first logged a BrokenPipe traceback."""
    from lsp_server.server import build_server

    ls = build_server(user_config=tmp_path / "none.toml")

    class Closed:
        writes = 0

        def write(self, data):
            Closed.writes += 1
            raise BrokenPipeError(32, "Broken pipe")

        def close(self):
            pass

    ls.protocol.writer = Closed()
    for i in range(3):
        ls.protocol._send_data({"jsonrpc": "2.0", "method": "window/logMessage", "params": {"type": 3, "message": str(i)}})
    assert Closed.writes == 1
