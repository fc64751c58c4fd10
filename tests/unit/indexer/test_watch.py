import time

from indexer.watch import watch_index

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
