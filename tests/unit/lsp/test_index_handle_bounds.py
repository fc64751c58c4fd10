"""IndexHandle keeps a bounded record of which paths changed (a long session touches every file)."""

from __future__ import annotations

from lsp_server import index_handle
from lsp_server.index_handle import IndexHandle


def test_the_per_path_change_counts_stay_bounded_and_typing_keeps_the_generation():
    handle = IndexHandle()
    bound = getattr(index_handle, "MAX_COUNTED_PATHS", 8192)
    for i in range(bound + 500):  # a branch switch or a build's outputs, for days
        handle.touch(f"/ws/gen/file{i}.py")
    assert len(handle._changes_by_path) <= bound
    before = handle.generation("/ws/app.py")
    handle.touch("/ws/app.py", "x = 1\n")
    handle.touch("/ws/app.py", "x = 12\n")  # typing in the file itself leaves its own value alone
    assert handle.generation("/ws/app.py")[:3] == before[:3]
    assert handle.generation("/ws/other.py")[:3] != before[:3]
