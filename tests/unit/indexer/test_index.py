import os

import pytest

from .conftest import write

UTIL = '''def parse_config(path):
    """Read a configuration file."""
    return open(path).read()


class ConfigLoader:
    def load_all(self, paths):
        return [parse_config(p) for p in paths]
'''
APP = '''from util import parse_config


def run_application():
    cfg = parse_config("app.toml")
    return cfg
'''


def paths(chunks):
    return [os.path.basename(c.path) for c in chunks]


def test_build_search_definitions(workspace, make_index):
    write(workspace, "util.py", UTIL)
    write(workspace, "app.py", APP)
    index = make_index(workspace)
    summary = index.build()
    assert summary["files"] == 2 and summary["chunks"] >= 3
    for mode in ("bm25", "dense", "hybrid"):
        hits = index.search("parse_config read configuration file", k=3, mode=mode)
        assert hits and hits[0].path.endswith("util.py"), mode
        assert hits[0].start_line >= 1 and hits[0].end_line >= hits[0].start_line
    hits = index.search("parse_config", k=5, exclude=workspace / "util.py")
    assert hits and all(not c.path.endswith("util.py") for c in hits)
    used = index.mentions("parse_config", 5, exclude=workspace / "app.py")
    assert used and {os.path.basename(c.path) for c in used} == {"util.py"}  # its definition and load_all's call
    assert "parse_config" in {os.path.basename(c.path): c.text for c in index.mentions("parse_config", 5)}["app.py"]
    (d,) = index.definitions("parse_config")
    assert d.path == str(workspace / "util.py") and (d.start_line, d.end_line) == (1, 3)
    assert index.chunk(d.chunk_id).text.startswith("def parse_config")
    (m,) = index.definitions("load_all")
    assert m.kind == "method" and m.container == "ConfigLoader"
    with pytest.raises(ValueError):
        index.search("x", mode="nonsense")


def test_incremental_add_update_remove(workspace, make_index):
    write(workspace, "util.py", UTIL)
    index = make_index(workspace)
    index.build()
    new = write(workspace, "extra.py", "def zebra_stripes():\n    return 42\n")
    index.touch(new)
    assert index.flush(timeout=30)
    assert paths(index.search("zebra_stripes", k=1, mode="bm25")) == ["extra.py"]
    assert index.definitions("zebra_stripes")
    write(workspace, "extra.py", "def lion_mane():\n    return 1\n")
    index.touch(new)
    assert index.flush(timeout=30)
    assert index.search("zebra_stripes", k=5, mode="bm25") == []
    assert index.definitions("zebra_stripes") == [] and index.definitions("lion_mane")
    new.unlink()
    index.remove(new)
    assert index.flush(timeout=30)
    assert index.search("lion_mane", k=5, mode="bm25") == [] and index.definitions("lion_mane") == []
    assert index.stats().files == 1


def test_overlay_overrides_disk_until_cleared(workspace, make_index):
    path = write(workspace, "mod.py", "def on_disk():\n    pass\n")
    index = make_index(workspace)
    index.build()
    index.touch(path, text="def in_buffer_only():\n    pass\n")
    assert index.flush(timeout=30)
    assert paths(index.search("in_buffer_only", k=1, mode="bm25")) == ["mod.py"]
    assert index.search("on_disk", k=1, mode="bm25") == []
    index.close_overlay(path)
    assert index.flush(timeout=30)
    assert paths(index.search("on_disk", k=1, mode="bm25")) == ["mod.py"]
    assert index.definitions("in_buffer_only") == []


def test_secrets_never_returned(workspace, make_index):
    write(workspace, ".env", "API_TOKEN=supersecretvalue\n")
    write(workspace, "deploy.pem", "supersecretvalue\n")
    write(workspace, "keys.py", "KEY = 'AKIAIOSFODNN7EXAMPLE'  # supersecretvalue\n")
    write(workspace, "ok.py", "def harmless():\n    pass\n")
    index = make_index(workspace)
    summary = index.build()
    assert summary["files"] == 1
    assert summary["skipped"]["secret_name"] == 2 and summary["skipped"]["secret_content"] == 1
    for mode in ("bm25", "dense", "hybrid"):
        assert all(c.path.endswith("ok.py") for c in index.search("supersecretvalue AKIAIOSFODNN7EXAMPLE", 10, mode=mode))
    # an unsaved buffer containing a key is not indexed either
    index.touch(workspace / "ok.py", text="TOKEN = 'ghp_" + "b" * 36 + "'\n")
    assert index.flush(timeout=30)
    assert index.search("ghp_" + "b" * 36, 5, mode="bm25") == []
    index.touch(workspace / ".env", text="X=1")
    assert index.flush(timeout=30) and index.stats().files <= 1


def test_reload_without_recompute(workspace, make_index, tmp_path):
    from .fakes import FakeEmbedder

    for i in range(5):
        write(workspace, f"m{i}.py", f"def func_{i}():\n    return {i}\n")
    first = FakeEmbedder()
    index = make_index(workspace, embedder=first)
    index.build()
    expected = [(c.path, c.start_line, c.text) for c in index.search("func_3", 3, mode="hybrid")]
    index.close()
    assert first.texts > 0
    second = FakeEmbedder()
    again = make_index(workspace, embedder=second)
    assert second.calls == 0  # loaded from SQLite: nothing re-embedded
    summary = again.build()
    assert summary["indexed_now"] == 0 and second.calls == 0
    assert [(c.path, c.start_line, c.text) for c in again.search("func_3", 3, mode="hybrid")] == expected
    assert again.definitions("func_4")
    embedded = second.texts  # just the query
    os.utime(workspace / "m1.py", (1, 1))  # touched but unchanged: content hash says no work
    again.build()
    assert second.texts == embedded


def test_changed_embedder_reembeds_from_store(workspace, make_index):
    from .fakes import FakeEmbedder

    write(workspace, "a.py", "def a():\n    pass\n")
    make_index(workspace, embedder=FakeEmbedder(dim=64)).build()
    other = FakeEmbedder(dim=32)
    index = make_index(workspace, embedder=other)
    assert other.texts == 1 and index.stats().vectors == 1


def test_file_deleted_mid_walk(workspace, make_index):
    write(workspace, "a.py", "def stays():\n    pass\n")
    doomed = write(workspace, "b.py", "def vanishes():\n    pass\n")
    index = make_index(workspace)
    original = index.filter.walk

    def walk_then_delete():
        result = original()
        doomed.unlink()
        return result

    index.filter.walk = walk_then_delete
    summary = index.build()
    assert summary["files"] == 1 and index.definitions("vanishes") == []


def test_bm25_only_index(workspace, make_index):
    write(workspace, "a.py", "def only_sparse():\n    pass\n")
    index = make_index(workspace, embedder=None)
    index.build()
    assert paths(index.search("only_sparse", 1)) == ["a.py"]
    assert index.search("only_sparse", 1, mode="dense") == []
    assert index.stats().embedder == "none"


def test_stats_and_progress(workspace, make_index):
    for i in range(3):
        write(workspace, f"m{i}.py", f"x{i} = {i}\n")
    write(workspace, "b.bin", b"\x00\x00")
    index = make_index(workspace)
    calls = []
    index.build(progress=lambda done, total, msg: calls.append((done, total)))
    assert calls[0] == (0, 4) and calls[-1] == (4, 4)
    st = index.stats()
    assert st.files == 3 and st.skipped == {"binary": 1} and st.last_index_seconds >= 0


def notebook(*cells) -> str:
    import json

    return json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {"language_info": {"name": "python"}},
                       "cells": [{"cell_type": kind, "metadata": {}, "source": source,
                                  **({"outputs": outputs, "execution_count": 1} if kind == "code" else {})}
                                 for kind, source, outputs in cells]})


def test_a_notebook_is_indexed_as_its_code_cells(workspace, make_index):
    png = {"output_type": "display_data", "data": {"image/png": "iVBORw0KGgo" + "Q" * 4000}, "metadata": {}}
    printed = {"output_type": "stream", "name": "stdout", "text": ["outputonlytoken 42\n"]}
    write(workspace, "analysis.ipynb", notebook(
        ("markdown", ["# Markdownonlytoken (heading\n"], None),
        ("code", ["import math\n", "\n", "def circle_area(r):\n", "    return math.pi * r ** 2\n"], [printed]),
        ("code", "plot(circle_area(2))", [png]),
    ))
    write(workspace, "broken.ipynb", "{not json")
    index = make_index(workspace)
    summary = index.build()
    assert summary["files"] == 1 and summary["skipped"]["bad_notebook"] == 1
    hits = index.search("circle_area", k=5, mode="bm25")
    assert paths(hits) and set(paths(hits)) == {"analysis.ipynb"}
    text = "\n".join(c.text for c in sorted(hits, key=lambda c: c.start_line))
    assert "def circle_area(r):" in text and "plot(circle_area(2))" in text  # chunked as Python: a def, a statement
    assert '"cell_type"' not in text and "iVBORw0KGgo" not in text
    for token in ("outputonlytoken", "Markdownonlytoken", "iVBORw0KGgo" + "Q" * 4000):
        assert index.search(token, k=5, mode="bm25") == [], token
    assert [s.name for s in index.definitions("circle_area")] == ["circle_area"]  # chunked as Python
    # an editor that shows the notebook's JSON as text: its unsaved buffer is indexed the same way
    index.touch(workspace / "analysis.ipynb", text=notebook(("code", "def in_buffer_cell():\n    pass\n", [])))
    assert index.flush(timeout=30)
    assert paths(index.search("in_buffer_cell", k=1, mode="bm25")) == ["analysis.ipynb"]
    assert index.search("circle_area", k=5, mode="bm25") == []
