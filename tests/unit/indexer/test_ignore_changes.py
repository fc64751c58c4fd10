"""An edited ignore file takes effect on what is already indexed, and a closed index takes no more updates."""

import os

from .conftest import write


def indexed(index, word):
    return sorted(os.path.relpath(c.path, index.roots[0]) for c in index.search(word, k=10, mode="bm25"))


def test_an_ignore_file_edit_drops_what_it_now_hides_and_indexes_what_it_no_longer_hides(workspace, make_index):
    write(workspace, "pkg/keep.py", "def quokka():\n    return 1\n")
    write(workspace, "pkg/gen/out.py", "def narwhal():\n    return 2\n")
    write(workspace, "pkg/old.py", "def axolotl():\n    return 3\n")
    write(workspace, "other/old.py", "def pangolin():\n    return 4\n")
    rules = write(workspace, "pkg/.draftlineignore", "old.py\n")
    index = make_index(workspace)
    index.build()
    assert indexed(index, "axolotl") == [] and indexed(index, "narwhal") == ["pkg/gen/out.py"]

    write(workspace, "pkg/.draftlineignore", "gen/\n")  # old.py is allowed again, gen/ is hidden now
    index.touch(rules)
    assert index.flush(timeout=30)
    assert indexed(index, "narwhal") == []
    assert indexed(index, "axolotl") == ["pkg/old.py"]
    assert indexed(index, "quokka") == ["pkg/keep.py"] and indexed(index, "pangolin") == ["other/old.py"]
    assert index.definitions("narwhal") == [] and index.definitions("axolotl")

    rules.unlink()  # no rules at all: everything under pkg/ is indexed
    index.remove(rules)
    assert index.flush(timeout=30)
    assert indexed(index, "narwhal") == ["pkg/gen/out.py"]
    assert index.stats().files == 4


def test_a_gitignore_at_the_root_reaches_nested_directories(workspace, make_index):
    write(workspace, "src/app.py", "def wombat():\n    return 1\n")
    write(workspace, "src/build/artifact.py", "def capybara():\n    return 2\n")
    index = make_index(workspace)
    index.build()
    assert indexed(index, "capybara") == ["src/build/artifact.py"]
    index.touch(write(workspace, ".gitignore", "build/\n"))
    assert index.flush(timeout=30)
    assert indexed(index, "capybara") == [] and indexed(index, "wombat") == ["src/app.py"]


def test_a_closed_index_ignores_late_updates(workspace, make_index):
    path = write(workspace, "mod.py", "def on_disk():\n    pass\n")
    index = make_index(workspace)
    index.build()
    index.close()
    index.touch(path, text="def in_buffer():\n    pass\n")  # an overlay timer firing after the session ended
    index.remove(path)
    assert index._worker is None  # no update thread started on the closed store
    assert index.flush(timeout=1)
