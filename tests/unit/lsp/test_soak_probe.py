"""A week-long session: what churn (files opened and closed, typed in, deleted, folders gone) leaves behind.

Every check counts retained entries or threads (deterministic); none measures memory or waits on a clock.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
import time
from pathlib import Path

import pytest
from lsprotocol import types as t
from pygls.workspace import Workspace

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from indexer import Index, IndexConfig  # noqa: E402
from indexer.watch import Watcher  # noqa: E402
from lsp_server.server import build_server  # noqa: E402
from tests.unit.lsp.waiting import until  # noqa: E402

BINARY = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR" * 8


def wait_threads_back(before: set[threading.Thread], timeout_s: float = 5.0) -> list[str]:
    """The names of threads started since ``before`` still alive once they had ``timeout_s`` to end
    (polled: a stopped observer's threads end on their own shortly after its join)."""
    end = time.monotonic() + timeout_s
    while True:
        extra = [th.name for th in threading.enumerate() if th not in before and th.is_alive()]
        if not extra or time.monotonic() > end:
            return extra
        time.sleep(0.01)


# -- the index's skip report ---------------------------------------------------------------------

def test_deleted_skipped_files_leave_the_index_skip_report(tmp_path: Path):
    """A build's binaries, a branch's images: each file skipped for its content and then deleted stayed in
    stats().skipped for good (a directory removed with them too), growing all week and reporting files
    that no longer exist."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.py").write_text("def f():\n    return 1\n")
    index = Index([ws], IndexConfig(cache_dir=tmp_path / "cache"), embedder=None)
    try:
        index.build()
        assert index.stats().skipped == {}
        images = [ws / f"img{i}.png" for i in range(20)]
        build = ws / "out"
        build.mkdir()
        objects = [build / f"o{i}.bin" for i in range(5)]
        for path in images + objects:
            path.write_bytes(BINARY)
            index.touch(path)
        assert index.flush(30)
        assert index.stats().skipped == {"binary": 25}
        for path in images:
            path.unlink()
            index.remove(path)
        shutil.rmtree(build)
        index.remove(build)  # the watcher reports a directory's removal, not each file's
        assert index.flush(30)
        assert index.stats().skipped == {}
        assert len(index._content_skipped) == 0
        # a file touched once it is gone (an editor's temp file) leaves it too
        temp = ws / "big.py"
        temp.write_text("x = 1\n" * 10)
        index.touch(temp, "AWS_SECRET_ACCESS_KEY = 'wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY'\n")
        assert index.flush(30)
        assert index.stats().skipped.get("secret_content") == 1
        temp.unlink()
        index.touch(temp)  # the buffer closed: the disk's text, which is gone
        assert index.flush(30)
        assert index.stats().skipped == {} and not index.indexed(temp)
    finally:
        index.close()


# -- the index's watcher ---------------------------------------------------------------------------

class Sink:
    def __init__(self) -> None:
        self.touched: list[str] = []

    def touch(self, path) -> None:
        self.touched.append(os.fsdecode(path))

    def remove(self, path) -> None:
        pass


def test_a_watcher_with_one_folder_gone_watches_the_others_and_leaves_no_threads(tmp_path: Path):
    """A multi-root workspace with one folder deleted: the watcher failed to start, so no root was
    watched, and the roots scheduled before the gone one kept an inotify instance and its threads that
    nothing stopped, again at every re-index (a folder change, an [index] setting)."""
    here, gone = tmp_path / "here", tmp_path / "gone"
    here.mkdir()
    before = set(threading.enumerate())
    for round_ in range(3):
        sink = Sink()
        watcher = Watcher([here, gone], sink, lambda p: False, debounce_s=0.01).start()
        try:
            new = here / f"new{round_}.py"
            new.write_text("x = 1\n")
            asyncio.run(until(lambda: str(new) in sink.touched))  # the root that exists is watched
        finally:
            watcher.stop()
    assert wait_threads_back(before) == []


def test_a_watcher_with_every_folder_gone_raises_and_leaves_no_threads(tmp_path: Path):
    before = set(threading.enumerate())
    with pytest.raises(OSError):
        Watcher([tmp_path / "gone", tmp_path / "also-gone"], Sink(), lambda p: False).start()
    assert wait_threads_back(before) == []


# -- the session's per-document state --------------------------------------------------------------

def test_a_long_session_of_documents_opened_typed_and_closed_leaves_no_per_document_state(tmp_path: Path):
    """Files in the workspace, outside it and untitled buffers, opened, typed in, completed and closed
    many times: nothing per document is left in the session, the scheduler, the suggestion cache or the
    index, and the index holds exactly the disk's files again (an unsaved buffer's text is gone, a file
    deleted while open is out of it)."""
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    ws.mkdir()
    outside.mkdir()
    (ws / "lib.py").write_text("def helper_on_disk(x):\n    return x + 1\n")
    (ws / "main.py").write_text("import lib\n\nvalue = lib.helper_on_disk(1)\n")
    ls = build_server(user_config=tmp_path / "none.toml")
    ls.protocol._workspace = Workspace(ws.as_uri())
    ls.protocol.client_capabilities = t.ClientCapabilities()
    app = ls.draftline
    app.roots[:] = [ws]
    features = ls.protocol.fm.features
    workspace = ls.workspace
    settings = {"model": {"target": "fake"}, "completion": {"debounce_ms": 0},
                "index": {"overlay_delay_ms": 0, "options": {"embedder": "none", "cache_dir": str(tmp_path / "cache"),
                                                             "bm25_df_cutoff": 0}}}

    def open_(uri: str, text: str) -> None:
        item = t.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)
        workspace.put_text_document(item)
        features[t.TEXT_DOCUMENT_DID_OPEN](t.DidOpenTextDocumentParams(text_document=item))

    def type_(uri: str, version: int, added: str) -> None:
        doc = workspace.get_text_document(uri)
        lines = doc.source.split("\n")
        end = t.Position(line=len(lines) - 1, character=len(lines[-1]))
        change = t.TextDocumentContentChangePartial(range=t.Range(start=end, end=end), text=added)
        params = t.DidChangeTextDocumentParams(
            text_document=t.VersionedTextDocumentIdentifier(uri=uri, version=version), content_changes=[change])
        workspace.update_text_document(params.text_document, change)
        features[t.TEXT_DOCUMENT_DID_CHANGE](params)

    def close(uri: str) -> None:
        params = t.DidCloseTextDocumentParams(text_document=t.TextDocumentIdentifier(uri=uri))
        workspace.remove_text_document(uri)
        features[t.TEXT_DOCUMENT_DID_CLOSE](params)

    async def complete(uri: str) -> None:
        doc = workspace.get_text_document(uri)
        lines = doc.source.split("\n")
        await app.suggest(uri, t.Position(line=len(lines) - 1, character=len(lines[-1])))

    async def session() -> None:
        app.configure(settings)
        await until(lambda: app.slot.state == "ready")
        await app.start_index()
        index = app.index.index
        baseline = index.stats()
        assert baseline.files == 2
        for round_ in range(12):
            uris = [(ws / "main.py").as_uri(), (ws / f"new{round_}.py").as_uri(),
                    (outside / f"o{round_}.py").as_uri(), f"untitled:Untitled-{round_}"]
            for uri in uris:
                open_(uri, "def only_in_the_buffer_%d(a):\n    return a" % round_)
            for version in range(2, 8):
                for uri in uris:
                    type_(uri, version, f" + {version}")
                    await complete(uri)
            for uri in uris:
                close(uri)
            assert index.flush(30)
            threads = sorted(th.name for th in threading.enumerate())
            if round_ == 0:
                first_round_threads = threads
            assert threads == first_round_threads  # no thread per request, per document or per round
        # a file made and opened, then deleted on disk while open (a branch switch), then closed
        doomed = ws / "doomed.py"
        doomed.write_text("def doomed():\n    pass\n")
        open_(doomed.as_uri(), "def doomed():\n    pass  # unsaved\n")
        doomed.unlink()
        app.disk_changed(str(doomed), True)
        close(doomed.as_uri())
        assert index.flush(30)
        await until(lambda: not app._overlay_timers)
        after = index.stats()
        assert (after.files, after.chunks, after.chars, after.symbols) == (
            baseline.files, baseline.chunks, baseline.chars, baseline.symbols)
        assert not index.indexed(doomed)
        assert index.definitions("only_in_the_buffer_0") == [] and index.definitions("doomed") == []
        found = index.search("helper_on_disk", 5)
        assert found and all("only_in_the_buffer" not in c.text for c in index.search("only_in_the_buffer_3", 5))
        assert index._overlays == {}
        assert app._overlaid == set() and app._overlay_timers == {}
        assert app.scheduler._tokens == {}
        assert app.cache._shown == {}
        assert len(app.cache._lru) <= app.config.completion.cache_size
        assert workspace.text_documents == {}
        stats = app.scheduler.stats
        assert stats.in_flight == 0 and stats.started > 0
        assert asyncio.all_tasks() == {asyncio.current_task()}  # nothing left pending on the loop

    try:
        asyncio.run(session())
    finally:
        app.close()


# -- the imports digest's built stubs ----------------------------------------------------------------

def test_the_digest_keeps_a_bounded_number_of_built_stubs_while_one_file_is_edited_for_days(tmp_path: Path):
    """Typing in one file leaves the index's generation as it was (its own changes do not count), so the
    stubs built for every import line that file ever had were all kept: one per edit of an import line."""
    from lsp_server import digest
    from lsp_server.index_handle import IndexHandle

    root = tmp_path / "ws"
    (root / "geo").mkdir(parents=True)
    (root / "geo" / "__init__.py").write_text("")
    (root / "geo" / "util.py").write_text("def helper(x):\n    return x\n")
    (root / "app.py").write_text("x = 1\n")
    index = Index([root], IndexConfig(cache_dir=tmp_path / "cache"), embedder=None)
    try:
        index.build()
        handle = IndexHandle()
        handle.index, handle.state = index, "ready"
        stubs = digest.Digest(handle)
        app = str(root / "app.py")
        for i in range(digest.MAX_ENTRIES + 200):  # the alias renamed again and again
            found = stubs.entries(app, f"from geo.util import helper as h{i}\n\n", "", [])
            assert [e.text for e in found] == ["def helper(x): ..."]
        assert len(stubs._entries) <= digest.MAX_ENTRIES
    finally:
        index.close()
