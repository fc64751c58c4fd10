"""The roots' .draftline.toml is watched by the server whether or not the index runs (clients without
file events see its edits too), on the roots' top level only."""

from __future__ import annotations

import asyncio

import pytest
from lsprotocol import types as t
from pygls.workspace import Workspace

from lsp_server.config import WORKSPACE_FILE
from lsp_server.server import build_server

from .waiting import until

WATCHED_S = 20.0  # a real file event's way through watchdog, on a loaded machine


@pytest.mark.parametrize("index", ["disabled from the start", "turned off by the file"])
def test_an_edit_of_the_workspace_file_applies_without_an_index_and_without_client_file_events(tmp_path, index):
    root = tmp_path / "ws"
    root.mkdir()
    toml = root / WORKSPACE_FILE
    enabled = index == "turned off by the file"
    toml.write_text(f"[completion]\ndebounce_ms = 1\n[index]\nenabled = {str(enabled).lower()}\n")
    ls = build_server(user_config=tmp_path / "none.toml")
    ls.protocol._workspace = Workspace(root.as_uri())
    ls.protocol.client_capabilities = t.ClientCapabilities()  # no didChangeWatchedFiles
    app = ls.draftline
    app.init_options = {"model": {"target": "fake"}, "index": {"options": {"embedder": "none",
                                                                            "cache_dir": str(tmp_path / "cache")}}}
    app.roots[:] = [root]

    async def run() -> None:
        app.configure()
        await app.start_index()
        assert app.config.completion.debounce_ms == 1 and app.config.index.enabled is enabled
        watches = [emitter.watch for emitter in app._config_watch._observer.emitters]
        assert [(w.path, w.is_recursive) for w in watches] == [(str(root), False)]  # the top level only
        if enabled:
            await until(lambda: app.index.watching, WATCHED_S)  # the index's watcher reports the file
            toml.write_text("[completion]\ndebounce_ms = 2\n[index]\nenabled = false\n")
            await until(lambda: app.config.completion.debounce_ms == 2 and app.index.index is None, WATCHED_S)
        toml.write_text("[completion]\ndebounce_ms = 3\n[index]\nenabled = false\n")  # no index watches now
        await until(lambda: app.config.completion.debounce_ms == 3, WATCHED_S)
        toml.unlink()
        await until(lambda: app.config.completion.debounce_ms != 3, WATCHED_S)  # back to the defaults

    try:
        asyncio.run(run())
    finally:
        app.close()
