"""A long editing session over stdio: after the churn, the server's state is what the disk says, nothing more."""

from __future__ import annotations

from pathlib import Path

from lsprotocol import types as t
from pytest_lsp import LanguageClient

from tests.e2e.lsp_harness import end_of, initialize, inline_params, insert, open_doc, wait_for

BINARY = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR" * 8


def settings(tmp_path: Path) -> dict:
    return {"draftline": {
        "model": {"target": "fake"},
        "completion": {"debounce_ms": 0},
        "index": {"overlay_delay_ms": 0,
                  "options": {"embedder": "none", "cache_dir": str(tmp_path / "cache"), "bm25_df_cutoff": 0}},
    }}


def events(client: LanguageClient, *changes: tuple[Path, t.FileChangeType]) -> None:
    params = t.DidChangeWatchedFilesParams(changes=[t.FileEvent(uri=p.as_uri(), type=kind) for p, kind in changes])
    client.workspace_did_change_watched_files(params)


def close_doc(client: LanguageClient, uri: str) -> None:
    client.text_document_did_close(t.DidCloseTextDocumentParams(text_document=t.TextDocumentIdentifier(uri=uri)))


def index_of(status: dict) -> tuple:
    index = status["index"]
    return index["files"], index["chunks"], index["chars"], index["symbols"]


async def test_a_long_session_leaves_the_index_as_the_disk_has_it_and_no_documents(client: LanguageClient,
                                                                                   tmp_path: Path):
    """Buffers in and out of the workspace and untitled ones, typed in, completed and closed; files made,
    opened and deleted while open; a build's binaries written and deleted: afterwards the index holds the
    disk's files and text only, reports no skipped file that is gone, and no document is open."""
    root, outside = tmp_path / "ws", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "lib.py").write_text("def helper_on_disk(x):\n    return x + 1\n")
    (root / "main.py").write_text("import lib\n\nvalue = lib.helper_on_disk(1)\n")
    await initialize(client, init_options=settings(tmp_path), roots=(root,))
    baseline = await wait_for(client, lambda s: s["index"]["state"] == "ready" and s["index"]["pending"] == 0)
    assert baseline["index"]["files"] == 2 and baseline["index"]["skipped"] == {}

    for round_ in range(8):
        uris = [(root / "main.py").as_uri(), (outside / f"o{round_}.py").as_uri(), f"untitled:Untitled-{round_}"]
        text = f"def only_in_the_buffer_{round_}(a):\n    return a"
        for uri in uris:
            open_doc(client, text, uri=uri)
        typed = text
        for version in range(2, 6):
            for uri in uris:
                insert(client, end_of(typed), f" + {version}", version, uri=uri)
            typed += f" + {version}"
            for uri in uris:
                await client.text_document_inline_completion_async(inline_params(end_of(typed), uri))
        for uri in uris:
            close_doc(client, uri)

    doomed = root / "doomed.py"  # made on disk, opened, deleted while open (a branch switch), closed
    doomed.write_text("def doomed():\n    pass\n")
    events(client, (doomed, t.FileChangeType.Created))
    open_doc(client, "def doomed():\n    pass  # unsaved\n", uri=doomed.as_uri())
    doomed.unlink()
    events(client, (doomed, t.FileChangeType.Deleted))
    close_doc(client, doomed.as_uri())

    out = root / "out"  # a build's outputs: skipped as binary, then deleted with their directory
    out.mkdir()
    binaries = [out / f"o{i}.bin" for i in range(6)] + [root / "logo.png"]
    for path in binaries:
        path.write_bytes(BINARY)
    events(client, *[(p, t.FileChangeType.Created) for p in binaries])
    await wait_for(client, lambda s: s["index"]["skipped"].get("binary") == len(binaries) and s["index"]["pending"] == 0)
    for path in binaries:
        path.unlink()
    out.rmdir()
    events(client, (out, t.FileChangeType.Deleted), (root / "logo.png", t.FileChangeType.Deleted))

    final = await wait_for(client, lambda s: s["index"]["pending"] == 0 and index_of(s) == index_of(baseline)
                           and s["index"]["skipped"] == {} and s["documents"] == 0)
    assert final["generations"]["in_flight"] == 0 and final["answered"] > 0
