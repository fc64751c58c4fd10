"""Review of the index store's `_known` rows and in-memory fallback (commit cf8549f): failing cases.

1. `Store._known` records *which paths* this process read or wrote, not *what state* it holds for them,
   so a row another server on the workspace rewrote or deleted for a path this process knows still
   decides what this process's build() does: the build compares the disk with the other process's row,
   not with what this index holds in memory (stale chunks served all session; a deleted file kept).
2. `Store._to_memory(keep=True)` where the file cannot be copied (an I/O error reads fail with too)
   starts an empty in-memory database whose AUTOINCREMENT restarts at 1 while the index's memory still
   holds chunks 1..N: the next write's chunk ids are those of other files, which it overwrites.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from indexer import Index, IndexConfig  # noqa: E402


def _config(tmp_path: Path) -> IndexConfig:
    return IndexConfig(cache_dir=tmp_path / "cache", embedder="none")


def test_a_file_another_server_reindexed_while_this_one_loaded_is_read_again_by_the_build(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    f = ws / "a.py"
    f.write_text("def alpha_one():\n    return 1\n")
    cfg = _config(tmp_path)
    with Index([ws], cfg, embedder=None) as first:
        first.build()
    mine = Index([ws], cfg, embedder=None)  # loaded the store: holds alpha_one for a.py
    try:
        f.write_text("def beta_two_changed():\n    return 22222\n")
        later = time.time() + 5
        os.utime(f, (later, later))
        with Index([ws], cfg, embedder=None) as other:  # another server on the workspace re-indexes a.py
            other.build()
        mine.build()
        assert [s.path for s in mine.definitions("beta_two_changed")] == [str(f)]
        assert mine.definitions("alpha_one") == []
    finally:
        mine.close()


def test_a_file_another_server_removed_while_this_one_loaded_leaves_this_index_too(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "keep.py").write_text("def kept_fn():\n    return 1\n")
    (ws / "old.py").write_text("def removed_fn():\n    return 2\n")
    cfg = _config(tmp_path)
    with Index([ws], cfg, embedder=None) as first:
        first.build()
    mine = Index([ws], cfg, embedder=None)  # loaded both files
    try:
        (ws / "old.py").unlink()
        with Index([ws], cfg, embedder=None) as other:  # another server drops old.py's rows
            other.build()
        mine.build()
        assert mine.definitions("removed_fn") == []
        assert mine.stats().files == 1
    finally:
        mine.close()


def _io_error() -> sqlite3.OperationalError:
    exc = sqlite3.OperationalError("disk I/O error")
    exc.sqlite_errorcode = sqlite3.SQLITE_IOERR
    return exc


class _GoneDisk:
    """The store's connection once its disk went away: a write transaction fails with SQLITE_IOERR, and
    so does reading the file for the backup into memory."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._real = db

    def __getattr__(self, name):
        return getattr(self._real, name)

    def cursor(self):
        real = self._real.cursor()

        class Cursor:
            def __getattr__(self, name):
                return getattr(real, name)

            def execute(self, sql, *args):
                if sql == "BEGIN IMMEDIATE":
                    raise _io_error()
                return real.execute(sql, *args)

        return Cursor()

    def backup(self, *args, **kwargs):
        raise _io_error()


def test_going_to_memory_without_a_copy_does_not_reuse_the_chunk_ids_the_index_holds(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    for i in range(3):
        (ws / f"m{i}.py").write_text(f"def func_{i}_alpha():\n    return {i}\n")
    index = Index([ws], _config(tmp_path), embedder=None)
    try:
        index.build()
        index.store._db = _GoneDisk(index.store._db)
        (ws / "m2.py").write_text("def changed_gamma():\n    return 9\n")
        index.touch(ws / "m2.py")
        assert index.flush(30)
        assert not index.store.persistent
        # every file keeps its own chunks: m0.py's was overwritten by m2.py's new one (same id 1)
        assert {index.chunk(cid).path for cid in index._path_chunks[str(ws / "m0.py")]} == {str(ws / "m0.py")}
        assert [c.path for c in index.search("func_0_alpha", 1)] == [str(ws / "m0.py")]
        assert [c.path for c in index.search("changed_gamma", 1)] == [str(ws / "m2.py")]
    finally:
        index.close()
