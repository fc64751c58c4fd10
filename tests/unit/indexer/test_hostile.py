"""Workspaces and events that once broke the index: odd names, deep trees, a broken store, races."""

from __future__ import annotations

import logging
import os
import shutil
import threading
from pathlib import Path

from indexer import Index, IndexConfig

from .conftest import write
from .fakes import FakeEmbedder


def indexed(index, ws, suffix=""):
    return sorted(os.path.relpath(p, ws) for p in index._digests if p.endswith(suffix))


def test_a_file_name_that_is_not_utf8_is_skipped_with_its_reason_and_the_rest_indexed(workspace, make_index, caplog):
    write(workspace, "ok.py", "def fine():\n    pass\n")
    bad = os.fsdecode(os.fsencode(workspace) + b"/caf\xe9.py")  # a Latin-1 name from a zip, say
    with open(os.fsencode(bad), "w") as fh:
        fh.write("def latin1_named():\n    pass\n")
    index = make_index(workspace)
    with caplog.at_level(logging.INFO, logger="indexer"):
        summary = index.build()
    assert indexed(index, workspace) == ["ok.py"]
    assert summary["skipped"].get("bad_name") == 1
    assert any(repr(bad) in r.getMessage() and "bad_name" in r.getMessage() for r in caplog.records)
    index.touch(bad)  # what the watcher or the client reports for it
    index.touch(workspace / "ok.py")
    assert index.flush(10)
    assert index._worker.errors == 0 and indexed(index, workspace) == ["ok.py"]


class _PoisonEmbedder(FakeEmbedder):
    """Fails on any batch holding one file's text: one bad file among good ones."""

    def embed(self, texts):
        if any("poisoned" in t for t in texts):
            raise ValueError("cannot embed this")
        return super().embed(texts)


def test_one_file_that_fails_to_index_does_not_fail_the_build(workspace, make_index):
    for i in range(5):
        write(workspace, f"good{i}.py", f"def good_{i}():\n    return {i}\n")
    write(workspace, "bad.py", "def poisoned():\n    pass\n")
    index = make_index(workspace, embedder=_PoisonEmbedder())
    index.build()
    assert indexed(index, workspace) == [f"good{i}.py" for i in range(5)]


def test_a_very_deep_directory_does_not_fail_the_build(workspace, make_index):
    deep = workspace / "deep"
    deep.mkdir()
    for _ in range(1100):  # deeper than Python's recursion limit (os.makedirs recurses too)
        deep = deep / "d"
        deep.mkdir()
    write(deep, "bottom.py", "def bottom():\n    pass\n")
    write(workspace, "top.py", "def top():\n    pass\n")
    try:
        index = make_index(workspace, embedder=None)
        index.build()
        assert "top.py" in indexed(index, workspace) and index.definitions("bottom")
    finally:  # bottom up: shutil.rmtree (pytest's clean-up) recurses too
        (deep / "bottom.py").unlink()
        while deep != workspace:
            deep.rmdir()
            deep = deep.parent


def test_a_corrupted_store_is_rebuilt_from_scratch(workspace, tmp_path, caplog):
    write(workspace, "a.py", "def alpha():\n    pass\n")
    cfg = IndexConfig(cache_dir=tmp_path / "cache")
    with Index([workspace], cfg, embedder=None) as index:
        index.build()
        store = index.store.path
    for suffix in ("-wal", "-shm"):
        Path(f"{store}{suffix}").unlink(missing_ok=True)
    store.write_bytes(b"this is not a database" * 100)
    with caplog.at_level(logging.WARNING, logger="indexer"), Index([workspace], cfg, embedder=None) as index:
        assert index.build()["files"] == 1 and index.definitions("alpha")
    assert any(str(store) in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


def test_a_store_that_fails_while_loading_is_rebuilt_from_scratch(workspace, tmp_path):
    for i in range(200):
        write(workspace, f"m{i}.py", f"def fn_{i}(x):\n    return x + {i}\n" * 20)
    cfg = IndexConfig(cache_dir=tmp_path / "cache")
    with Index([workspace], cfg, embedder=None) as index:
        index.build()
        store = index.store.path
    data = store.read_bytes()
    store.write_bytes(data[: len(data) // 3])  # truncated: the header reads, the tables do not
    with Index([workspace], cfg, embedder=None) as index:
        assert index.build()["files"] == 200 and index.definitions("fn_7")


class _GatedEmbedder(FakeEmbedder):
    """Once armed, holds the worker inside a batch until released."""

    def __init__(self):
        super().__init__()
        self.armed = False
        self.inside = threading.Event()
        self.release = threading.Event()

    def embed(self, texts):
        if self.armed:
            self.inside.set()
            assert self.release.wait(20)
        return super().embed(texts)


def test_removing_a_directory_drops_the_files_under_it_being_indexed_at_that_moment(workspace, tmp_path, make_index):
    write(workspace, "main.py", "import os\n")
    embedder = _GatedEmbedder()
    index = make_index(workspace, embedder=embedder)
    index.build()
    embedder.armed = True
    new = [write(workspace, f"pkg/mod{i}.py", f"def unique_fn_{i}(x):\n    return x\n") for i in range(3)]
    for path in new:
        index.touch(path)
    assert embedder.inside.wait(20)  # the worker has read them and is embedding
    shutil.move(str(workspace / "pkg"), str(tmp_path / "pkg"))  # moved to the trash
    index.remove(workspace / "pkg")
    embedder.release.set()
    assert index.flush(20)
    assert indexed(index, workspace) == ["main.py"]
    assert index.search("unique_fn_1", k=3, mode="bm25") == []


def test_a_removed_directory_takes_its_cached_ignore_rules_along(workspace, tmp_path, make_index):
    write(workspace, "pkg/.gitignore", "data.py\n")
    write(workspace, "pkg/sub/.gitignore", "other.py\n")
    write(workspace, "pkg/data.py", "def data_v1():\n    pass\n")
    write(workspace, "pkg/sub/other.py", "def other_v1():\n    pass\n")
    index = make_index(workspace, embedder=None)
    index.build()
    assert indexed(index, workspace, ".py") == []
    (workspace / "pkg").rename(tmp_path / "old_pkg")
    index.remove(workspace / "pkg")
    # a new pkg without ignore files: what the old ones hid is indexed now
    write(workspace, "pkg/data.py", "def data_v2():\n    pass\n")
    write(workspace, "pkg/sub/other.py", "def other_v2():\n    pass\n")
    assert index.filter.path_reason(workspace / "pkg" / "data.py") is None
    assert index.filter.path_reason(workspace / "pkg" / "sub" / "other.py") is None
    index.touch(workspace / "pkg" / "data.py")
    index.touch(workspace / "pkg" / "sub" / "other.py")
    assert index.flush(10)
    assert indexed(index, workspace, ".py") == ["pkg/data.py", "pkg/sub/other.py"]


def test_the_watchers_walk_of_a_directory_moved_in_forgets_its_cached_ignore_rules(workspace, tmp_path, make_index):
    from indexer.watch import watch_index

    write(workspace, "pkg/.gitignore", "data.py\n")
    write(workspace, "pkg/data.py", "def data_v1():\n    pass\n")
    index = make_index(workspace, embedder=None)
    index.build()
    assert index.filter.path_reason(workspace / "pkg" / "data.py") == "ignored"
    shutil.rmtree(workspace / "pkg")  # gone without a removal reaching the index yet (another sink's loop)
    write(tmp_path, "new_pkg/data.py", "def data_v2():\n    pass\n")
    (tmp_path / "new_pkg").rename(workspace / "pkg")
    touched = []

    class Sink:
        def touch(self, path):
            touched.append(os.path.relpath(path, workspace))

        def remove(self, path):
            pass

    watcher = watch_index(index, sink=Sink())
    try:
        watcher._dispatch({str(workspace / "pkg"): "touch_dir"})  # what a directory moved in brings
    finally:
        watcher.stop()
    assert touched == ["pkg/data.py"]


def test_an_indexed_file_replaced_by_a_link_out_of_the_workspace_leaves_the_index(workspace, tmp_path, make_index):
    from indexer.watch import watch_index

    write(workspace, "conf.py", "def old_conf_fn():\n    pass\n")
    outside = write(tmp_path, "outside/secret.py", "def outside_fn():\n    pass\n")
    index = make_index(workspace, embedder=None)
    index.build()
    os.symlink(outside, workspace / ".conf.tmp")
    os.replace(workspace / ".conf.tmp", workspace / "conf.py")  # an atomic replace by the link
    watcher = watch_index(index, sink=index)
    try:
        watcher._dispatch({str(workspace / ".conf.tmp"): "remove", str(workspace / "conf.py"): "touch"})
    finally:
        watcher.stop()
    assert index.flush(10)
    assert indexed(index, workspace) == [] and index.definitions("old_conf_fn") == []
    assert index.definitions("outside_fn") == []


def test_a_changed_files_definitions_replace_its_own_and_no_others(workspace, make_index):
    """Definitions are kept by name and path (a 20k-file tree's 14,280 `__init__`s were filtered as one
    list on every save of a file defining one: 1,000 saves took 49 s to index, 1.7 s now)."""
    for name in ("a", "b", "c"):
        write(workspace, f"{name}.py", "class K:\n    def __init__(self):\n        pass\n")
    index = make_index(workspace)
    index.build()
    write(workspace, "b.py", "\n\nclass K:\n    def __init__(self):\n        pass\n\n    def __init__(self, x):\n        pass\n")
    index.touch(workspace / "b.py")
    assert index.flush(10)
    where = sorted((os.path.basename(s.path), s.start_line) for s in index.definitions("__init__"))
    assert where == [("a.py", 2), ("b.py", 4), ("b.py", 7), ("c.py", 2)]
    index.remove(workspace / "a.py")
    assert index.flush(10)
    assert sorted(os.path.basename(s.path) for s in index.definitions("__init__")) == ["b.py", "b.py", "c.py"]
    index.remove(workspace / "b.py")
    index.remove(workspace / "c.py")
    assert index.flush(10) and index.definitions("__init__") == [] and "__init__" not in index._symbols


def test_bulk_skips_are_counted_in_one_line_not_logged_per_file(workspace, make_index, caplog):
    """A 20k-file tree's .pyc and .so files wrote 10,484 "skip ... (binary)" lines at every start."""
    write(workspace, "ok.py", "x = 1\n")
    for i in range(5):
        (workspace / f"m{i}.py").write_bytes(b"\x00\x01binary")
    index = make_index(workspace)
    with caplog.at_level(logging.INFO, logger="indexer"):
        index.build()
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert not any("(binary)" in line for line in lines)
    assert any(line.startswith("indexed 1 files") and "binary 5" in line for line in lines)


def test_the_build_offers_to_yield_between_files(workspace, make_index):
    for i in range(4):
        write(workspace, f"m{i}.py", f"def f{i}():\n    return {i}\n")
    index = make_index(workspace)
    calls: list[int] = []
    index.yield_to = lambda: calls.append(1)
    index.build()
    assert len(calls) >= 4 and index.definitions("f3")  # at least once a file read (and once a file chunked)
