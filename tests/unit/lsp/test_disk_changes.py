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


def test_a_directory_moved_out_back_in_and_out_again_is_removed_each_time(tmp_path):
    changes, ws, trash = DiskChanges(), tmp_path / "ws", tmp_path / "trash"
    (ws / "pkg").mkdir(parents=True)
    trash.mkdir()
    module = ws / "pkg" / "mod.py"
    module.write_text("x = 1\n")
    assert changes.is_new(str(module), deleted=False)  # edited once: its state is known
    (ws / "pkg").rename(trash / "pkg")
    assert changes.is_new(str(ws / "pkg"), deleted=True)
    assert not changes.is_new(str(ws / "pkg"), deleted=True)  # the other watcher's copy
    (trash / "pkg").rename(ws / "pkg")  # back in: a rename keeps the file's size, mtime and inode
    assert changes.is_new(str(module), deleted=False)  # the index dropped it with its directory
    assert not changes.is_new(str(module), deleted=False)
    (ws / "pkg").rename(trash / "pkg")
    assert changes.is_new(str(ws / "pkg"), deleted=True)  # gone again: not a copy of the first removal
    assert not changes.is_new(str(ws / "pkg"), deleted=True)


class _RecordingIndex:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def touch(self, path: str, text: str | None = None) -> None:
        self.calls.append(("touch", path, text))

    def remove(self, path: str) -> None:
        self.calls.append(("remove", path))

    def close(self) -> None:
        pass

    def key(self, path: str) -> str:  # IndexHandle.key: the index's spelling of a path (here, as given)
        return path


def test_an_external_write_to_a_file_with_unsaved_changes_keeps_the_buffer_in_the_index(tmp_path):
    from lsp_server.server import build_server

    app = build_server().draftline
    app.index = index = _RecordingIndex()
    lib, other = tmp_path / "lib.py", tmp_path / "other.py"
    lib.write_text("def disk_version(): pass\n")
    other.write_text("x = 1\n")
    app.index_touch(lib.as_uri(), "def buffer_version(): pass\n")  # didOpen/didChange: unsaved text
    lib.write_text("def external_write(): pass\n")  # a tool rewrites the file under the editor
    app.disk_changed(str(lib), deleted=False)
    other.write_text("x = 2\n")
    app.disk_changed(str(other), deleted=False)
    assert index.calls == [("touch", str(lib), "def buffer_version(): pass\n"), ("touch", str(other), None)]
    app.index_touch(lib.as_uri(), None)  # saved or closed: the disk counts again
    lib.write_text("def external_again(): pass\n")
    app.disk_changed(str(lib), deleted=False)
    assert index.calls[-1] == ("touch", str(lib), None)
    app.index_touch(lib.as_uri(), "def typed_again(): pass\n")
    lib.unlink()  # deleted under the editor: its unsaved text is still what it shows
    app.disk_changed(str(lib), deleted=True)
    assert index.calls[-1] == ("touch", str(lib), "def typed_again(): pass\n")
    app.close()


def test_the_paths_remembered_stay_bounded_and_a_copy_of_a_recent_change_still_passes_once(tmp_path):
    """Every path a long session's file events named was remembered for good (build outputs too)."""
    changes = DiskChanges()
    bound = getattr(DiskChanges, "MAX_SEEN", 8192)
    for i in range(bound + 300):
        assert changes.is_new(str(tmp_path / f"gone{i}.o"), deleted=True)
    assert len(changes._seen) <= bound
    recent = tmp_path / "b.py"
    recent.write_text("x = 1\n")
    assert changes.is_new(str(recent), deleted=False)
    assert not changes.is_new(str(recent), deleted=False)  # the other watcher's copy
