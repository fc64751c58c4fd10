import time

from indexer.watch import Watcher, watch_index

from .conftest import write


def wait_for(predicate, deadline_s=20.0):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_watchdog_event_makes_new_file_searchable(workspace, make_index):
    write(workspace, ".gitignore", "ignored_dir/\n")
    write(workspace, "a.py", "def existing():\n    pass\n")
    index = make_index(workspace)
    index.build()
    watcher = watch_index(index, debounce_s=0.05)
    try:
        write(workspace, "new_module.py", "def freshly_watched_function():\n    return 1\n")
        write(workspace, "ignored_dir/x.py", "def should_not_appear():\n    pass\n")
        assert wait_for(lambda: index.flush(1) and index.definitions("freshly_watched_function"))
        assert index.search("freshly_watched_function", 1, mode="bm25")[0].path.endswith("new_module.py")
        (workspace / "new_module.py").unlink()
        assert wait_for(lambda: index.flush(1) and not index.definitions("freshly_watched_function"))
        assert index.definitions("should_not_appear") == []
    finally:
        watcher.stop()


class _Recorder:
    def __init__(self):
        self.calls = []

    def touch(self, path):
        self.calls.append(("touch", str(path)))

    def remove(self, path):
        self.calls.append(("remove", str(path)))


def test_directory_replaced_within_one_debounce_is_removed_then_walked(workspace, tmp_path, make_index):
    write(workspace, "pkg/old.py", "def old_function():\n    pass\n")
    index = make_index(workspace)
    index.build()
    (workspace / "pkg").rename(tmp_path / "moved_out")  # mv ws/pkg /outside; mv /other ws/pkg
    write(workspace, "pkg/new.py", "def new_function():\n    pass\n")
    pkg, new = str(workspace / "pkg"), str(workspace / "pkg" / "new.py")
    recorder = _Recorder()
    # the watcher is not started: its events are fed and its settled batch dispatched by hand
    watcher = Watcher([workspace], recorder, lambda p: False)
    watcher._note(pkg, "remove")
    watcher._note(pkg, "touch_dir")
    batch = dict(watcher._pending)
    watcher._dispatch(batch)
    assert recorder.calls == [("remove", pkg), ("touch", new)]
    watcher.sink = index
    watcher._dispatch(batch)
    assert index.flush(timeout=30)
    assert not index.definitions("old_function") and index.definitions("new_function")
    assert index.stats().files == 1


def test_directory_replaced_by_a_file_within_one_debounce_is_removed_then_touched(workspace, tmp_path, make_index):
    """mv ws/pkg /outside; mv ws/new.tmp ws/pkg: the pending remove of the directory must survive the
    file's touch, or the old directory's files stay indexed (and searchable) for good."""
    write(workspace, "pkg/old.py", "def old_function():\n    pass\n")
    index = make_index(workspace)
    index.build()
    (workspace / "pkg").rename(tmp_path / "moved_out")
    write(workspace, "pkg", "def new_function():\n    pass\n")
    pkg = str(workspace / "pkg")
    recorder = _Recorder()
    # the watcher is not started: its events are fed and its settled batch dispatched by hand
    watcher = Watcher([workspace], recorder, lambda p: False)
    watcher._note(pkg, "remove")  # the directory moved away
    watcher._note(pkg, "touch")  # a file moved in under its name
    watcher._note(pkg, "touch")  # ... and written again: still remove-then-touch
    batch = dict(watcher._pending)
    watcher._dispatch(batch)
    assert recorder.calls == [("remove", pkg), ("touch", pkg)]
    watcher.sink = index
    watcher._dispatch(batch)
    assert index.flush(timeout=30)
    assert not index.definitions("old_function")
    assert [c.path for c in index.search("old_function", 5, mode="bm25")] == [pkg]  # the new file only
    assert sorted(index._digests) == [pkg]


def test_an_edit_of_the_roots_git_info_exclude_is_followed(workspace, make_index):
    """.git/info/exclude hides files like a root .gitignore; its edits came under .git/ and were dropped."""
    write(workspace, ".git/HEAD", "ref: refs/heads/main\n")
    write(workspace, ".git/info/exclude", "scratch/\n")
    write(workspace, "scratch/notes.py", "def hidden_scratch_helper():\n    pass\n")
    write(workspace, "local.py", "def local_only_helper():\n    pass\n")
    index = make_index(workspace)
    index.build()
    assert index.definitions("local_only_helper") and not index.definitions("hidden_scratch_helper")
    watcher = watch_index(index, debounce_s=0.05)
    try:
        write(workspace, ".git/info/exclude", "local.py\n")  # scratch/ is allowed again, local.py hidden
        assert wait_for(lambda: index.flush(1) and index.definitions("hidden_scratch_helper")
                        and not index.definitions("local_only_helper"))
        (workspace / ".git" / "info" / "exclude").unlink()
        assert wait_for(lambda: index.flush(1) and index.definitions("local_only_helper"))
        assert index.definitions("hidden_scratch_helper")
        assert not any("/.git/" in p for p in index._digests)  # the exclude file itself is never indexed
    finally:
        watcher.stop()
