"""An index reopened ([index] settings, workspace folders) gets the session's unsaved buffers at once."""

from __future__ import annotations

import asyncio

import pytest
from lsprotocol import types as t
from pygls.workspace import Workspace

from lsp_server import daemon, index_handle
from lsp_server.server import build_server


class FakeIndex:
    """An index that records what it was given: built, touched with (path, unsaved text), closed."""

    def __init__(self, roots, cfg) -> None:
        self.roots, self.options = roots, dict(cfg.options)
        self.touches: list[tuple[str, str | None]] = []
        self.built = self.closed = False

    def build(self, progress=None) -> None:
        self.built = True

    def touch(self, path, text=None) -> None:
        self.touches.append((str(path), text))

    def remove(self, path) -> None:
        self.touches.append((str(path), None))

    def close(self) -> None:
        self.closed = True


def settings(**options) -> dict:
    return {"model": {"target": "fake"}, "index": {"enabled": True, "overlay_delay_ms": 0, "options": options}}


async def settled() -> None:
    """Every task the handlers scheduled (the re-index) has run."""
    while tasks := asyncio.all_tasks() - {asyncio.current_task()}:
        await asyncio.gather(*tasks)


@pytest.mark.parametrize("daemon_session", [False, True], ids=["stdio", "daemon"])
def test_a_reopened_index_holds_the_open_buffers_text_without_waiting_for_their_next_edit(monkeypatch, tmp_path,
                                                                                         daemon_session):
    opened: list[FakeIndex] = []

    def open_index(roots, cfg):
        opened.append(FakeIndex(roots, cfg))
        return opened[-1]

    monkeypatch.setattr(index_handle, "open_index", open_index)
    monkeypatch.setattr(daemon, "open_index", open_index)
    shared = daemon.Shared() if daemon_session else None
    ls = build_server(user_config=tmp_path / "none.toml", shared=shared)
    ls.protocol._workspace = Workspace(tmp_path.as_uri())
    ls.protocol.client_capabilities = t.ClientCapabilities()  # as initialize leaves it
    app = ls.draftline
    app.roots[:] = [tmp_path]
    other = tmp_path / "other"
    unsaved, saved = tmp_path / "unsaved.py", tmp_path / "saved.py"
    for path, text in ((unsaved, "def only_in_the_buffer(): pass\n"), (saved, "x = 1\n")):
        ls.workspace.put_text_document(t.TextDocumentItem(uri=path.as_uri(), language_id="python", version=1,
                                                          text=text))
    folders = ls.protocol.fm.features[t.WORKSPACE_DID_CHANGE_WORKSPACE_FOLDERS]

    async def run() -> None:
        app.configure(settings(max_file_bytes=1000))
        await app.start_index()
        app.edited(unsaved.as_uri(), "def only_in_the_buffer(): pass\n")
        app.edited(saved.as_uri(), "x = 1\n")
        app.index_touch(saved.as_uri(), None)  # saved: the disk's text is the one
        app.configure(settings(max_file_bytes=2000))  # another index: re-indexed
        await settled()
        folders(t.DidChangeWorkspaceFoldersParams(event=t.WorkspaceFoldersChangeEvent(
            added=[t.WorkspaceFolder(uri=other.as_uri(), name="other")], removed=[])))
        await settled()

    try:
        asyncio.run(run())
    finally:
        app.close()
        if shared is not None:
            shared.close()
    first, by_settings, by_folders = opened
    buffer = (str(unsaved), "def only_in_the_buffer(): pass\n")
    assert by_settings.options == {"max_file_bytes": 2000} and by_folders.roots == [tmp_path, other]
    for index in (by_settings, by_folders):
        assert index.built and buffer in index.touches  # at once, with no edit since
        assert all(path != str(saved) for path, _ in index.touches)  # a saved buffer is not overlaid again
    assert first.closed and by_settings.closed
    assert first.touches[-1] == (str(unsaved), None)  # the old index went back to the disk's text
