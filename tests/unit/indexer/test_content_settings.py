"""Settings that change what is read or how it is chunked invalidate the on-disk cache."""

from __future__ import annotations

from .conftest import write

KEY = "AKIAIOSFODNN7EXAMPLE"


def _snapshot(index):
    return sorted((c.path, c.start_line, c.end_line, c.text, c.kind, c.name) for c in index._chunks.values())


def test_turning_secret_exclusion_on_drops_a_cached_secret(workspace, make_index, tmp_path):
    write(workspace, "conf.py", f"KEY = '{KEY}'\n")
    write(workspace, "a.py", "def keep_me():\n    pass\n")
    cache = tmp_path / "cache"
    index = make_index(workspace, embedder=None, cache=cache, exclude_secrets=False)
    index.build()
    assert [c.path for c in index.search(KEY, 5, mode="bm25")] == [str(workspace / "conf.py")]
    index.close()
    index = make_index(workspace, embedder=None, cache=cache, exclude_secrets=True)
    assert index.search(KEY, 5, mode="bm25") == []  # not searchable even before the build
    result = index.build()
    assert result["indexed_now"] == 2 and result["files"] == 1
    assert index.search(KEY, 5, mode="bm25") == []
    assert index.stats().skipped.get("secret_content") == 1
    assert index.definitions("keep_me")


def test_chunk_size_change_rechunks_unchanged_files(workspace, make_index, tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(50))
    write(workspace, "big.py", f"def big():\n{body}    return x0\n")
    cache = tmp_path / "cache"
    index = make_index(workspace, cache=cache)
    index.build()
    before = len(index._chunks)
    index.close()
    small = dict(max_chunk_lines=10, window_lines=5)
    index = make_index(workspace, cache=cache, **small)
    assert index.build()["indexed_now"] == 1
    fresh = make_index(workspace, cache=tmp_path / "fresh", **small)
    fresh.build()
    assert len(index._chunks) > before and _snapshot(index) == _snapshot(fresh)
    assert index.stats().vectors == len(index._chunks)
    index.close()
    index = make_index(workspace, cache=cache, **small)  # the same settings: the cache is kept
    assert index.build()["indexed_now"] == 0 and _snapshot(index) == _snapshot(fresh)
