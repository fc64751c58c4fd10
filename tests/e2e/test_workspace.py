"""The workspace index behind the server: background indexing, retrieval, file events, progress."""

from __future__ import annotations

from pathlib import Path

from lsprotocol import types as t
from pytest_lsp import LanguageClient

from tests.e2e.lsp_harness import end_of, initialize, inline_params, insert, items, open_doc, status, wait_for

HELPERS = "def compute_checksum(data):\n    total = 0\n    for byte in data:\n        total += byte\n    return total\n"


def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "helpers.py").write_text(HELPERS)
    (root / "other.py").write_text("class Parser:\n    def parse(self, text):\n        return text.split()\n")
    (root / "main.py").write_text("def checksum_of(payload):\n    pass\n")  # the editor has unsaved changes
    return root


def index_options(tmp_path: Path) -> dict:
    return {"draftline": {
        "model": {"target": "fake"},
        "completion": {"debounce_ms": 0},
        "index": {"options": {"embedder": "none", "cache_dir": str(tmp_path / "cache"), "bm25_df_cutoff": 0}},
    }}


async def test_index_feeds_retrieval_and_follows_file_events(client: LanguageClient, tmp_path: Path):
    root = workspace(tmp_path)
    await initialize(client, init_options=index_options(tmp_path), roots=(root,))
    ready = await wait_for(client, lambda s: s["index"]["state"] == "ready")
    assert ready["index"]["files"] == 3
    assert any(r.method == t.WORKSPACE_DID_CHANGE_WATCHED_FILES for r in client.registrations)

    text = "def checksum_of(payload):\n    return compute_checksum"
    uri = (root / "main.py").as_uri()
    open_doc(client, text, uri=uri)
    await wait_for(client, lambda s: s["index"]["pending"] == 0)  # the unsaved overlay is indexed too
    assert items(await client.text_document_inline_completion_async(inline_params(end_of(text), uri)))
    chunks = (await status(client))["last_chunks"]
    assert chunks and chunks[0].startswith("helpers.py:") and not any(c.startswith("main.py") for c in chunks)

    extra = root / "extra.py"
    extra.write_text("def extra():\n    return 1\n")
    event = t.FileEvent(uri=extra.as_uri(), type=t.FileChangeType.Created)
    client.workspace_did_change_watched_files(t.DidChangeWatchedFilesParams(changes=[event]))
    await wait_for(client, lambda s: s["index"]["files"] == 4)
    extra.unlink()
    event = t.FileEvent(uri=extra.as_uri(), type=t.FileChangeType.Deleted)
    client.workspace_did_change_watched_files(t.DidChangeWatchedFilesParams(changes=[event]))
    await wait_for(client, lambda s: s["index"]["files"] == 3)


async def test_indexing_progress_is_reported_to_clients_that_accept_it(client: LanguageClient, tmp_path: Path):
    root = workspace(tmp_path)
    result = await initialize(client, "visual-studio-code", init_options=index_options(tmp_path), roots=(root,))
    assert result.capabilities.inline_completion_provider is not None
    await wait_for(client, lambda s: s["index"]["state"] == "ready")
    await wait_for(client, lambda s: any(
        isinstance(v, t.WorkDoneProgressEnd) for reports in client.progress_reports.values() for v in reports
    ))
    (reports,) = client.progress_reports.values()
    assert isinstance(reports[0], t.WorkDoneProgressBegin)


async def test_every_workspace_folder_is_indexed(client: LanguageClient, tmp_path: Path):
    first = workspace(tmp_path)
    second = tmp_path / "second"
    second.mkdir()
    (second / "lib.py").write_text("def shared_helper():\n    return 42\n")
    await initialize(client, init_options=index_options(tmp_path), roots=(first, second))
    ready = await wait_for(client, lambda s: s["index"]["state"] == "ready")
    assert ready["index"]["files"] == 4 and ready["roots"] == [str(first), str(second)]


async def test_workspace_folder_changes_re_root_the_index(client: LanguageClient, tmp_path: Path):
    first = workspace(tmp_path)
    second = tmp_path / "second"
    second.mkdir()
    (second / "lib.py").write_text("def shared_helper():\n    return 42\n")
    await initialize(client, init_options=index_options(tmp_path), roots=(first,))
    await wait_for(client, lambda s: s["index"]["state"] == "ready" and s["index"]["files"] == 3)
    change = t.WorkspaceFoldersChangeEvent(
        added=[t.WorkspaceFolder(uri=second.as_uri(), name="second")],
        removed=[t.WorkspaceFolder(uri=first.as_uri(), name="ws")],
    )
    client.workspace_did_change_workspace_folders(t.DidChangeWorkspaceFoldersParams(event=change))
    ready = await wait_for(client, lambda s: s["roots"] == [str(second)] and s["index"]["state"] == "ready")
    assert ready["index"]["files"] == 1
    text = "def use():\n    return shared"
    uri = (second / "use.py").as_uri()
    open_doc(client, text, uri=uri)
    assert items(await client.text_document_inline_completion_async(inline_params(end_of(text), uri)))
    assert any(c.startswith("lib.py:") for c in (await status(client))["last_chunks"])


async def test_an_unwritable_index_directory_leaves_completion_working(client: LanguageClient, tmp_path: Path):
    root = workspace(tmp_path)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache directory should go")
    options = index_options(tmp_path)
    options["draftline"]["index"]["options"]["cache_dir"] = str(blocker / "cache")
    await initialize(client, init_options=options, roots=(root,))
    done = await wait_for(client, lambda s: s["index"]["state"] not in ("none", "opening", "building"))
    # the store goes on in memory (indexer.store: not saved, the next start indexes again)
    assert done["index"]["state"] == "ready" and done["index"]["files"] >= 1
    text = "def f():\n    return compute"
    uri = (root / "main.py").as_uri()
    open_doc(client, text, uri=uri)
    assert items(await client.text_document_inline_completion_async(inline_params(end_of(text), uri)))


async def test_typing_reindexes_the_buffer_once_typing_pauses(client: LanguageClient, tmp_path: Path):
    root = workspace(tmp_path)
    options = index_options(tmp_path)
    options["draftline"]["index"]["overlay_delay_ms"] = 50
    await initialize(client, init_options=options, roots=(root,))
    await wait_for(client, lambda s: s["index"]["state"] == "ready")
    text = "def checksum_of(payload):\n    pass\n"
    uri = (root / "main.py").as_uri()
    open_doc(client, text, uri=uri)
    before = (await wait_for(client, lambda s: s["index"]["pending"] == 0))["index"]["chars"]
    added = "\n\ndef freshly_typed_helper(value):\n    return value * 3\n"
    for i, ch in enumerate(added):  # keystrokes: the buffer is re-indexed after the pause, not per key
        insert(client, t.Position(line=2, character=0) if i == 0 else _end(text + added[:i]), ch, version=2 + i, uri=uri)
    after = await wait_for(client, lambda s: s["index"]["chars"] >= before + len(added.strip()) and s["index"]["pending"] == 0)
    assert after["index"]["files"] == 3


def _end(text: str) -> t.Position:
    lines = text.split("\n")
    return t.Position(line=len(lines) - 1, character=len(lines[-1]))


async def test_the_index_follows_changes_on_disk_without_any_client_notification(client: LanguageClient, tmp_path: Path):
    """A `git checkout` while the server runs: files appear (in a new directory too), change and go, and
    the client says nothing (many clients never watch files); the server's own watcher tells the index."""
    root = workspace(tmp_path)
    await initialize(client, init_options=index_options(tmp_path), roots=(root,))
    ready = await wait_for(client, lambda s: s["index"]["state"] == "ready")
    assert ready["index"]["files"] == 3 and ready["index"]["watching"]

    (root / "feature").mkdir()
    (root / "feature" / "billing.py").write_text("def compute_invoice_total(lines):\n    return sum(lines)\n")
    (root / "tax.py").write_text("RATE = 0.2\n")
    (root / "other.py").unlink()
    (root / "helpers.py").write_text("def renamed_checksum(data):\n    return sum(data) % 256\n")
    await wait_for(client, lambda s: s["index"]["files"] == 4 and s["index"]["pending"] == 0, deadline_s=20)

    text = "def invoice(lines):\n    return compute_invoice_total"
    uri = (root / "main.py").as_uri()
    open_doc(client, text, uri=uri)
    await wait_for(client, lambda s: s["index"]["pending"] == 0)
    assert items(await client.text_document_inline_completion_async(inline_params(end_of(text), uri)))
    assert any(c.startswith("feature/billing.py:") for c in (await status(client))["last_chunks"])

    # the roots change: the old watcher stops, a new one watches the new root
    second = tmp_path / "second"
    second.mkdir()
    (second / "lib.py").write_text("def shared_helper():\n    return 42\n")
    change = t.WorkspaceFoldersChangeEvent(added=[t.WorkspaceFolder(uri=second.as_uri(), name="second")],
                                           removed=[t.WorkspaceFolder(uri=root.as_uri(), name="ws")])
    client.workspace_did_change_workspace_folders(t.DidChangeWorkspaceFoldersParams(event=change))
    await wait_for(client, lambda s: s["roots"] == [str(second)] and s["index"]["state"] == "ready"
                   and s["index"]["files"] == 1 and s["index"]["watching"])
    (second / "more.py").write_text("def more():\n    return 1\n")
    await wait_for(client, lambda s: s["index"]["files"] == 2, deadline_s=20)


async def test_index_settings_apply_live_from_the_client_and_from_the_workspace_file(client: LanguageClient, tmp_path: Path):
    """[index] changes take effect without a restart: from didChangeConfiguration, and from an edit
    of the root's .draftline.toml that no client reports (the server's watcher sees it)."""
    root = workspace(tmp_path)
    await initialize(client, init_options=index_options(tmp_path), roots=(root,))
    await wait_for(client, lambda s: s["index"]["state"] == "ready" and s["index"]["files"] == 3)

    off = {"draftline": {"index": {"enabled": False}}}
    client.workspace_did_change_configuration(t.DidChangeConfigurationParams(settings=off))
    await wait_for(client, lambda s: s["index"]["state"] == "none")
    on = {"draftline": {"index": {"enabled": True}}}
    client.workspace_did_change_configuration(t.DidChangeConfigurationParams(settings=on))
    await wait_for(client, lambda s: s["index"]["state"] == "ready" and s["index"]["files"] == 3)

    # the workspace file: files over 60 bytes are skipped from now on (helpers.py and other.py are
    # longer; main.py and the TOML itself stay)
    (root / ".draftline.toml").write_text("[index.options]\nmax_file_bytes = 60\n")
    await wait_for(client, lambda s: s["index"]["state"] == "ready" and s["index"]["files"] == 2, deadline_s=20)
