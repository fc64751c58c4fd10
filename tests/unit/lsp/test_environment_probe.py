"""A first run in a hostile environment: config files that are not text, no home directory, a cache that
cannot be written, a full disk, two servers on one workspace. The server degrades (logged), never fails."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from indexer import Index, IndexConfig
from indexer.store import FileRecord, Store
from lsp_server.config import resolve_config

EDITOR = {"draftline": {"model": {"target": "fake"}, "completion": {"debounce_ms": 3}}}
NOT_UTF8 = b'[completion]\nmode = "\xff\xfe"\n'  # a Latin-1 editor's save, or a binary file by that name


def test_a_user_config_that_is_not_utf8_is_ignored_and_the_editor_settings_still_apply(tmp_path, caplog):
    user = tmp_path / "config.toml"
    user.write_bytes(NOT_UTF8)  # raised UnicodeDecodeError out of initialize: no model, ever
    with caplog.at_level(logging.WARNING, logger="lsp_server.config"):
        cfg = resolve_config(user_file=user, init_options=EDITOR)
    assert cfg.model.target == "fake" and cfg.completion.debounce_ms == 3
    assert any(str(user) in r.getMessage() and "UTF-8" in r.getMessage() for r in caplog.records)


def test_a_cloned_workspace_file_that_is_not_utf8_or_nests_too_deep_is_ignored(tmp_path):
    latin, deep = tmp_path / "latin", tmp_path / "deep"
    for root in (latin, deep):
        root.mkdir()
    (latin / ".draftline.toml").write_bytes(NOT_UTF8)
    (deep / ".draftline.toml").write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")  # RecursionError in tomllib
    cfg = resolve_config(user_file=tmp_path / "none.toml", workspace_roots=[latin, deep], init_options=EDITOR)
    assert cfg.model.target == "fake" and cfg.completion.debounce_ms == 3


def test_no_home_directory_means_no_user_config_not_a_failed_initialize(monkeypatch, caplog):
    def no_home(cls):  # what Path.home() does without HOME for a user id the passwd file lacks (containers)
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.setattr(Path, "home", classmethod(no_home))
    with caplog.at_level(logging.WARNING, logger="lsp_server.config"):
        cfg = resolve_config(init_options=EDITOR)
    assert cfg.model.target == "fake"
    assert any("no user config" in r.getMessage() for r in caplog.records)


def _workspace(root: Path, n: int) -> Path:
    root.mkdir()
    for i in range(n):
        (root / f"m{i}.py").write_text(f'def func_{i}_alpha():\n    return "zebra{i}" * 40\n')
    return root


def _found(index: Index, i: int) -> bool:
    return any(c.path.endswith(f"m{i}.py") for c in index.search(f"zebra{i} func_{i}_alpha", 3))


@pytest.mark.parametrize("where", ["under_a_file", "store_is_a_directory"])
def test_an_index_cache_that_cannot_be_written_keeps_the_index_in_memory(tmp_path, caplog, where):
    ws = _workspace(tmp_path / "ws", 3)
    (tmp_path / "a-file").write_text("x")
    cache = tmp_path / "a-file" / "cache"  # mkdir: NotADirectoryError (what root cannot bypass, as it can chmod)
    if where == "store_is_a_directory":  # sqlite: unable to open database file
        cache = tmp_path / "cache"
        (cache / "index.sqlite3").mkdir(parents=True)
    with caplog.at_level(logging.WARNING, logger="indexer"):
        with Index([ws], IndexConfig(cache_dir=cache, embedder="none"), embedder=None) as index:
            assert index.build()["files"] == 3
            assert all(_found(index, i) for i in range(3))
            assert not index.store.persistent
    assert sum("in memory only" in r.getMessage() for r in caplog.records) == 1


def test_a_full_disk_while_indexing_keeps_every_file_searchable_and_the_saved_part_whole(tmp_path, caplog):
    ws = _workspace(tmp_path / "ws", 30)
    cfg = IndexConfig(cache_dir=tmp_path / "cache", embedder="none", embed_batch=4)  # a transaction every few files
    index = Index([ws], cfg, embedder=None)
    pages = index.store._db.execute("PRAGMA page_count").fetchone()[0]
    index.store._db.execute(f"PRAGMA max_page_count={pages}")  # SQLite's own SQLITE_FULL, as on a full disk
    with caplog.at_level(logging.WARNING, logger="indexer"):
        assert index.build()["files"] == 30  # was: each file failed on its own, most of them left out
    assert all(_found(index, i) for i in range(30))
    (ws / "m0.py").write_text("def changed_beta():\n    return 2\n")
    index.touch(ws / "m0.py")
    assert index.flush(30) and index._worker.errors == 0
    assert [c.path for c in index.search("changed_beta", 1)] == [str(ws / "m0.py")]
    index.close()
    assert sum("in memory only" in r.getMessage() for r in caplog.records) == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    db = sqlite3.connect(tmp_path / "cache" / "index.sqlite3")  # what was saved is whole files
    files = {p for (p,) in db.execute("SELECT path FROM files")}
    with_chunks = {p for (p,) in db.execute("SELECT DISTINCT path FROM chunks")}
    db.close()
    assert files == with_chunks and len(files) < 30


def test_two_servers_started_at_once_on_one_workspace_both_index_every_file(tmp_path):
    ws = _workspace(tmp_path / "ws", 3)
    cfg = IndexConfig(cache_dir=tmp_path / "cache", embedder="none")
    with Index([ws], cfg, embedder=None) as first, Index([ws], cfg, embedder=None) as second:  # both open an empty store
        first.build()
        second.build()  # found the first's rows up to date and skipped them: an empty index all session
        for index in (first, second):
            assert index.stats().files == 3 and all(_found(index, i) for i in range(3))
            assert [s.path for s in index.definitions("func_1_alpha")] == [str(ws / "m1.py")]
    with Index([ws], cfg, embedder=None) as third:  # the next start loads one copy of each file
        assert third.stats().files == 3 and third.stats().chunks == 3


def test_store_rows_written_by_another_process_count_as_not_indexed_here(tmp_path):
    mine, other = (Store(tmp_path, "none", 0) for _ in range(2))
    mine.read_all()
    other.read_all()
    other.write_files([FileRecord("/w/a.py", 1.0, 1, "d", "python", [], [], [], None)])
    assert list(other.file_states()) == ["/w/a.py"]
    assert mine.file_states() == {}  # not in this index's memory: its build indexes it again
    mine.close()
    other.close()


def test_no_home_directory_puts_the_caches_under_the_temporary_directory(monkeypatch):
    """Path.home() raises without HOME and a passwd entry: the index's and the models' cache roots did too."""
    import pathlib

    from engine.gguf import cache_root
    from indexer.config import default_cache_root

    def no_home():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("DRAFTLINE_CACHE_DIR", raising=False)
    monkeypatch.setattr(pathlib.Path, "home", staticmethod(no_home))
    import tempfile

    for root in (cache_root(), default_cache_root()):
        assert str(root).startswith(tempfile.gettempdir()) and "draftline" in root.name
