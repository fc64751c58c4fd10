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


def test_the_file_table_forgets_names_no_file_has_any_more():
    from indexer.imports import FileTable

    table = FileTable()
    for i in range(100):  # files created and deleted under ever new names
        table.add(f"/ws/tmp{i}/mod{i}.py")
        table.remove(f"/ws/tmp{i}/mod{i}.py")
    table.add("/ws/pkg/util.py")
    assert table.named("util.py") == ["/ws/pkg/util.py"] and table.in_dir("pkg") == ["/ws/pkg/util.py"]
    assert len(table._named) == 1 and len(table._dirs) == 1
