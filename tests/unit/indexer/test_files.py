import logging
import os
from pathlib import Path

import pytest

from indexer.config import IndexConfig
from indexer.files import FileFilter

from .conftest import write


def walk(ws: Path, **cfg):
    result = FileFilter([ws], IndexConfig(**cfg)).walk()
    return sorted(os.path.relpath(f.path, ws) for f in result.files), result.skipped


def test_nested_gitignore_exclude_and_draftlineignore(workspace):
    write(workspace, ".gitignore", "*.log\nbuild/\n!keep.log\n")
    write(workspace, ".git/info/exclude", "local_only.py\n")
    write(workspace, ".git/config", "[core]\n")
    write(workspace, ".draftlineignore", "generated/\n")
    write(workspace, "a.py", "x = 1\n")
    write(workspace, "debug.log", "log\n")
    write(workspace, "keep.log", "kept\n")
    write(workspace, "build/out.py", "y = 1\n")
    write(workspace, "local_only.py", "z = 1\n")
    write(workspace, "generated/g.py", "g = 1\n")
    write(workspace, "sub/.gitignore", "secret_sauce.py\n!debug.log\n")
    write(workspace, "sub/secret_sauce.py", "s = 1\n")
    write(workspace, "sub/ok.py", "o = 1\n")
    write(workspace, "sub/debug.log", "re-included by the deeper file\n")
    files, skipped = walk(workspace)
    assert files == [".draftlineignore", ".gitignore", "a.py", "keep.log", "sub/.gitignore", "sub/debug.log", "sub/ok.py"]
    assert skipped["ignored"] >= 5


def test_path_reason_matches_walk(workspace):
    write(workspace, ".gitignore", "build/\n")
    ff = FileFilter([workspace], IndexConfig())
    assert ff.path_reason(workspace / "build" / "deep" / "x.py") == "ignored"
    assert ff.path_reason(workspace / "src" / "x.py") is None
    assert ff.path_reason(workspace / ".env") == "secret_name"
    assert ff.path_reason(workspace.parent / "elsewhere.py") == "outside_roots"


@pytest.mark.parametrize("name", [".env", ".env.local", "id_rsa", "id_ed25519.pub", "server.pem", "tls.key",
                                  "credentials.json", ".npmrc", ".netrc"])
def test_secret_names_skipped(workspace, name):
    write(workspace, name, "TOKEN=abc\n")
    files, skipped = walk(workspace)
    assert files == [] and skipped["secret_name"] == 1


@pytest.mark.parametrize("content", [
    "-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----\n",
    "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Bl\n",
    "aws_key = 'AKIAIOSFODNN7EXAMPLE'\n",
    "token = 'ghp_" + "a" * 36 + "'\n",
])
def test_secret_content_skipped(workspace, content):
    path = write(workspace, "config.py", content)
    ff = FileFilter([workspace], IndexConfig())
    src, reason = ff.read(str(path))
    assert src is None and reason == "secret_content"
    src, reason = FileFilter([workspace], IndexConfig(exclude_secrets=False)).read(str(path))
    assert src is not None and reason is None


def test_binary_huge_non_utf8_unreadable(workspace, caplog):
    binary = write(workspace, "blob.py", b"\x00\x01\x02abc")
    huge = write(workspace, "huge.py", "x = 1\n" * 400)
    latin = write(workspace, "latin.py", "s = 'caf\xe9'\n".encode("latin-1"))
    fine = write(workspace, "fine.py", "ok = True\n")
    cfg = IndexConfig(max_file_bytes=1000)
    with caplog.at_level(logging.INFO, logger="indexer.files"):
        files, skipped = walk(workspace, max_file_bytes=1000)
    assert "huge.py" not in files and skipped["too_large"] == 1
    assert any("too_large" in r.getMessage() for r in caplog.records)
    ff = FileFilter([workspace], cfg)
    assert ff.read(str(binary)) == (None, "binary")
    assert ff.read(str(latin)) == (None, "not_utf8")
    assert ff.read(str(huge)) == (None, "too_large")
    assert ff.read(str(workspace / "gone.py")) == (None, "vanished")
    assert ff.read(str(fine))[0].text == "ok = True\n"
    if os.geteuid() != 0:  # root can read anything
        locked = write(workspace, "locked.py", "x = 1\n")
        locked.chmod(0)
        assert ff.read(str(locked)) == (None, "unreadable")


def test_symlink_loops_and_broken_links(workspace):
    write(workspace, "pkg/mod.py", "def f():\n    pass\n")
    os.symlink(workspace / "pkg", workspace / "pkg" / "loop")  # directory loop
    os.symlink(workspace / "a_link", workspace / "b_link")
    os.symlink(workspace / "b_link", workspace / "a_link")  # file symlink loop
    os.symlink(workspace / "missing.py", workspace / "dangling.py")
    files, skipped = walk(workspace)
    assert files == ["pkg/mod.py"]
    assert skipped["symlink_loop"] >= 2
    assert skipped["broken_symlink"] == 1


def test_cache_dir_inside_workspace_is_never_walked(workspace):
    write(workspace, "a.py", "x = 1\n")
    write(workspace, ".cache/index.py", "x = 2\n")
    files = FileFilter([workspace], IndexConfig(), extra_excluded_dirs=(workspace / ".cache",)).walk().files
    assert [os.path.basename(f.path) for f in files] == ["a.py"]
