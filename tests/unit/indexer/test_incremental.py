"""Edits rewrite only what they change: stable chunk ids, incremental parsing, schema upgrade, fast secrets scan."""

import random
import re
import sqlite3

import numpy as np
import pytest

from indexer import Index, IndexConfig
from indexer.chunker import Chunker, text_edit
from indexer.config import DEFAULT_SECRET_CONTENT_PATTERNS
from indexer.dense import normalise
from indexer.files import FileFilter
from indexer.vectors import VectorMatrix, matvec

from .conftest import write
from .fakes import FakeEmbedder

MODULE = "\n\n".join(f"def function_{i}(x):\n    '''Doc {i}.'''\n    return x * {i}\n" for i in range(12))


def _snapshot(index):
    return sorted((c.path, c.start_line, c.end_line, c.text, c.kind, c.name) for c in index._chunks.values())


def test_edit_keeps_ids_of_unchanged_chunks(workspace, make_index, tmp_path):
    path = write(workspace, "mod.py", MODULE)
    embedder = FakeEmbedder()
    index = make_index(workspace, embedder=embedder)
    index.build()
    before = {c.name: c for c in index.chunks_for(path)}
    texts = embedder.texts
    # one function changes, lines are inserted above the rest (which only move)
    edited = "import os\n\n" + MODULE.replace("return x * 5", "return x * 5 + unicorn_offset")
    index.touch(path, text=edited)
    assert index.flush(timeout=30)
    after = {c.name: c for c in index.chunks_for(path)}
    assert embedder.texts - texts == 2  # the edited function and the new import window, nothing else
    assert after["function_5"].id != before["function_5"].id
    for name in ("function_0", "function_11"):
        assert after[name].id == before[name].id
        assert after[name].start_line == before[name].start_line + 2
    assert [c.name for c in index.search("unicorn_offset", 3, mode="bm25")] == ["function_5"]
    assert index.search("function_11", 1, mode="bm25")[0].start_line == after["function_11"].start_line
    qv = FakeEmbedder().embed([after["function_7"].indexed_text])[0]
    assert index.vectors.search(qv, 1)[0].chunk_id == after["function_7"].id
    (d,) = index.definitions("function_11")
    assert d.chunk_id == after["function_11"].id and d.start_line == after["function_11"].start_line
    assert index.stats().vectors == index.stats().chunks == len(after)
    memory = _snapshot(index)
    index.close()
    reloaded = make_index(workspace, embedder=FakeEmbedder())
    assert _snapshot(reloaded) == memory  # the store holds exactly what memory held
    assert reloaded.bm25.num_docs == len(memory)
    fresh = make_index(workspace, embedder=FakeEmbedder(), cache=tmp_path / "fresh")
    fresh.touch(path, text=edited)
    fresh.build()
    assert fresh.flush(timeout=30) and _snapshot(fresh) == memory


def test_edit_replacing_most_chunks_and_duplicates(workspace, make_index):
    path = write(workspace, "dup.py", "x = 1\n\n\ndef f():\n    pass\n\n\ndef f():\n    pass\n")
    index = make_index(workspace)
    index.build()
    write(workspace, "dup.py", "def f():\n    pass\n\n\ndef g():\n    return 2\n\n\ndef h():\n    return 3\n")
    index.touch(path)
    assert index.flush(timeout=30)
    chunks = index.chunks_for(path)
    assert [c.name for c in chunks] == ["f", "g", "h"] and len({c.id for c in chunks}) == 3
    assert index.bm25.num_docs == 3 and index.stats().vectors == 3
    assert sorted(c.name for c in index.search("return", 5, mode="bm25")) == ["g", "h"]


def test_schema_1_cache_is_dropped_and_rebuilt(workspace, tmp_path):
    cache = tmp_path / "old-cache"
    cache.mkdir()
    db = sqlite3.connect(cache / "index.sqlite3")
    db.executescript("""
        CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO meta VALUES('schema', '1');
        CREATE TABLE files(path TEXT PRIMARY KEY, mtime REAL, size INTEGER, digest TEXT, language TEXT);
        CREATE TABLE chunks(id INTEGER PRIMARY KEY AUTOINCREMENT, path TEXT, start_line INTEGER, end_line INTEGER,
            kind TEXT, name TEXT, header TEXT, text TEXT, tokens TEXT);
        INSERT INTO files VALUES('/nowhere/x.py', 1, 1, 'd', 'python');
        INSERT INTO chunks(path, start_line, end_line, kind, name, header, text, tokens)
            VALUES('/nowhere/x.py', 1, 1, 'module', NULL, '', 'stale', 'stale');
    """)
    db.commit()
    db.close()
    write(workspace, "a.py", "def fresh_start():\n    pass\n")
    with Index([workspace], IndexConfig(cache_dir=cache), embedder=FakeEmbedder()) as index:
        assert index.stats().files == 0
        assert index.build()["files"] == 1
        assert index.search("stale", 5, mode="bm25") == []
        assert [c.name for c in index.search("fresh_start", 1)] == ["fresh_start"]


def test_incremental_reparse_matches_a_fresh_parse():
    rng = random.Random(0)
    text = MODULE + "\n\nclass Box:\n    def open(self):\n        return 1\n"
    kept = Chunker(IndexConfig())
    kept.chunk("/ws/m.py", text, "m.py")
    inserts = ["x", "\n", "def inserted():\n    pass\n", "", "(", '"""', "class K:\n", "    "]
    for _ in range(60):
        pos = rng.randrange(len(text) + 1)
        text = text[:pos] + rng.choice(inserts) + text[pos + rng.randrange(4):]
        assert kept.chunk("/ws/m.py", text, "m.py") == Chunker(IndexConfig()).chunk("/ws/m.py", text, "m.py")


def test_text_edit_span():
    assert text_edit(b"abc", b"abc") is None
    assert text_edit(b"abcdef", b"abXdef") == (2, 3, 3)
    assert text_edit(b"aaaa", b"aaaaa") == (4, 4, 5)  # the suffix never overlaps the prefix
    assert text_edit(b"", b"xy") == (0, 0, 2)
    assert text_edit(b"hello world", b"hello") == (5, 11, 5)


@pytest.mark.parametrize("text,secret", [
    ("key = 'AKIAIOSFODNN7EXAMPLE'", True),
    ("AKIAIOSFODNN7EXAMPLE", True),
    ("xAKIAIOSFODNN7EXAMPLE", False),  # no word boundary before it
    ("t = 'ghp_" + "a" * 36 + "'", True),
    ("_ghp_" + "a" * 36, False),
    ("é" + "ghp_" + "a" * 36, False),  # \b is Unicode-aware, and so is the look-behind
    ("github_pat_" + "d" * 22, True),
    ("slack = 'xoxb-1234567890'", True),
    ("k = 'sk-proj-" + "a" * 40 + "'", True),
    ("task-" + "a" * 40, False),
    ("AIza" + "b" * 35, True),
    ("glpat-" + "c" * 20, True),
    ("AWS_SECRET_ACCESS_KEY = " + "A" * 40, True),
    ("plain code = 1", False),
])
def test_secret_patterns_keep_word_boundaries(workspace, text, secret):
    ff = FileFilter([workspace], IndexConfig())
    assert ff.content_is_secret(text) is secret
    old_style = [re.sub(r"^(\w+)\(\?<!\\w\1\)", r"\\b\1", p) for p in DEFAULT_SECRET_CONTENT_PATTERNS]
    assert any(re.search(p, text) for p in old_style) is secret


def test_vector_topk_matches_brute_force_with_free_slots():
    rng = np.random.default_rng(1)
    vecs = normalise(rng.normal(size=(300, 32)))
    m = VectorMatrix(32, capacity=8)
    m.add(list(range(300)), vecs)
    m.remove(list(range(0, 300, 3)))
    alive = [i for i in range(300) if i % 3]
    q = vecs[4]
    expect = sorted(alive, key=lambda i: -(vecs[i] @ q))
    assert [h.chunk_id for h in m.search(q, 10)] == expect[:10]
    assert [h.chunk_id for h in m.search(q, 10, exclude={4, 5})] == [i for i in expect if i not in (4, 5)][:10]
    assert len(m.search(q, 1000)) == len(alive)
    assert np.allclose(matvec(vecs, q), vecs @ q, atol=1e-5)


def _totals(index):
    return (sum(len(c.text) for c in index._chunks.values()), sum(len(v) for v in index._path_symbols.values()))


def test_stats_totals_follow_edits_removals_and_reloads(workspace, make_index):
    """stats() keeps chars and symbols as running totals (no scan under the lock at each status poll):
    they must equal a fresh count through edits that keep some chunk ids, overlays, removals, a reload."""
    rng = random.Random(7)
    paths = [write(workspace, f"m{i}.py", MODULE) for i in range(4)]
    index = make_index(workspace)
    index.build()
    stats = index.stats()
    assert (stats.chars, stats.symbols) == _totals(index) and stats.chars > 0 and stats.symbols >= 48
    for step in range(12):
        path = rng.choice(paths)
        n = rng.randrange(12)
        text = MODULE.replace(f"return x * {n}", f"return x * {n} + {'y' * rng.randrange(1, 40)}")
        if step % 3 == 0:
            text = "import os\n\n" + text + f"\n\ndef extra_{step}():\n    return {step}\n"
        index.touch(path, text=text)  # an unsaved buffer
        assert index.flush(timeout=30)
        stats = index.stats()
        assert (stats.chars, stats.symbols) == _totals(index), step
    paths[0].unlink()
    index.remove(paths[0])
    index.close_overlay(paths[1])
    assert index.flush(timeout=30)
    stats = index.stats()
    assert (stats.chars, stats.symbols) == _totals(index)
    index.close()
    reloaded = make_index(workspace)
    stats = reloaded.stats()
    assert (stats.chars, stats.symbols) == _totals(reloaded) and stats.chars > 0
