"""Changes on disk reach the index once, whether the client's watcher, ours, or both report them."""

from __future__ import annotations

import os

from lsp_server.server import DiskChanges


def test_a_change_reported_by_both_watchers_passes_once(tmp_path):
    changes, path = DiskChanges(), tmp_path / "a.py"
    path.write_text("x = 1\n")
    assert changes.is_new(str(path), deleted=False)  # ours
    assert not changes.is_new(str(path), deleted=False)  # the client's copy of the same change
    path.write_text("x = 22\n")  # a new change: the file's state moved
    assert changes.is_new(str(path), deleted=False)
    os.utime(path, ns=(1, 1))  # only the mtime: still a change (the index compares the content)
    assert changes.is_new(str(path), deleted=False)
    path.unlink()
    assert changes.is_new(str(path), deleted=True)
    assert not changes.is_new(str(path), deleted=True)
    assert not changes.is_new(str(path), deleted=False)  # a late "modified" for a file already gone
    path.write_text("x = 3\n")
    assert changes.is_new(str(path), deleted=False)  # created again
    changes.clear()  # the roots changed: nothing is a copy any more
    assert changes.is_new(str(path), deleted=False)


def test_only_index_changes_that_need_it_reopen_the_index():
    from lsp_server.config import IndexSettings
    from lsp_server.server import _index_needs_rebuild

    base = IndexSettings()
    assert not _index_needs_rebuild(base, IndexSettings(overlay_delay_ms=10))  # read where it is used
    assert _index_needs_rebuild(base, IndexSettings(enabled=False))
    assert _index_needs_rebuild(base, IndexSettings(options={"embedder": "none"}))
    assert not _index_needs_rebuild(base, IndexSettings())
