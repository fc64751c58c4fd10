"""workspace/didChangeWorkspaceFolders: the roots follow the client's folders, however their URIs end."""

from __future__ import annotations

import asyncio

from lsprotocol import types as t

from lsp_server.server import build_server


def test_a_removed_folder_leaves_the_roots_and_an_added_one_joins_once_with_or_without_a_trailing_slash(tmp_path):
    first, second, third = (tmp_path / name for name in ("first", "second", "third"))
    ls = build_server(user_config=tmp_path / "none.toml")
    app = ls.draftline
    app.init_options = {"model": {"target": "fake"}}  # the handler's configure() loads no real model
    app.roots[:] = [first, second]
    reindexed: list[list] = []

    async def reindex() -> None:
        reindexed.append(list(app.roots))

    app.reindex = reindex
    handler = ls.protocol.fm.features[t.WORKSPACE_DID_CHANGE_WORKSPACE_FOLDERS]
    change = t.WorkspaceFoldersChangeEvent(  # `second` added again, another way: still one root
        added=[t.WorkspaceFolder(uri=third.as_uri() + "/", name="third"),
               t.WorkspaceFolder(uri=second.as_uri() + "/", name="second")],
        removed=[t.WorkspaceFolder(uri=first.as_uri() + "/", name="first")],  # as some clients send it
    )

    async def run() -> None:
        handler(t.DidChangeWorkspaceFoldersParams(event=change))
        await asyncio.sleep(0)  # the re-index it scheduled

    try:
        asyncio.run(run())
    finally:
        app.close()
    assert app.roots == [second, third]
    assert reindexed == [[second, third]]


def test_a_folder_given_twice_at_initialize_is_one_root(tmp_path):
    ls = build_server(user_config=tmp_path / "none.toml")
    folders = [t.WorkspaceFolder(uri=tmp_path.as_uri(), name="a"), t.WorkspaceFolder(uri=tmp_path.as_uri() + "/", name="b")]
    try:
        ls.draftline.set_roots(t.InitializeParams(capabilities=t.ClientCapabilities(), workspace_folders=folders))
        assert ls.draftline.roots == [tmp_path]
    finally:
        ls.draftline.close()
