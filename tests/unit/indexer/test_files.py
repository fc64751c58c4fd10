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


# Canary secrets: one of each shape the content patterns know (none of them is a real credential).
PEM_BODY = ["MIIEpAIBAAKCAQEAcanaryPemLine1xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
            "Zm9vYmFyY2FuYXJ5UGVtTGluZTJ4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4eHh4",
            "Q2FuYXJ5TGFzdA=="]
CANARIES = {
    "aws_id": "AKIACANARY0123456789",
    "aws_secret": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYCANARY0KEY",
    "github": "ghp_" + "C4n4ry" * 6,
    "github_pat": "github_pat_" + "C4n4ry_" * 4,
    "slack": "xoxb-1234-C4n4ry-5678",
    "openai": "sk-proj-" + "C4n4ryC4n4ry" * 3,
    "google": "AIza" + "C4n4ry_-" * 4 + "abc",
    "gitlab": "glpat-" + "C4n4ry-" * 3,
}
SECRET_DOC = "\n".join([
    "import os",
    "-----BEGIN RSA PRIVATE KEY-----", *PEM_BODY, "-----END RSA PRIVATE KEY-----",
    f"AWS_ID = '{CANARIES['aws_id']}'",
    f"aws_secret_access_key = \"{CANARIES['aws_secret']}\"",
    f"TOKENS = ['{CANARIES['github']}', '{CANARIES['github_pat']}', '{CANARIES['slack']}']",
    f"KEYS = {{'openai': '{CANARIES['openai']}', 'google': '{CANARIES['google']}', 'gitlab': '{CANARIES['gitlab']}'}}",
    '{"private_key": "-----BEGIN PRIVATE KEY-----\\n' + "\\n".join(PEM_BODY) + '\\n-----END PRIVATE KEY-----\\n"}',
    'HEADER = "-----BEGIN RSA PRIVATE KEY-----"  # code about keys is no key',
    "def main():",
    "    return os.environ['HOME']",
    "",
])


def test_redact_hides_every_canary_and_keeps_the_rest():
    from indexer.files import redact

    out = redact(SECRET_DOC)
    for secret in [*CANARIES.values(), *PEM_BODY]:
        assert secret in SECRET_DOC and secret not in out, secret
    assert out.count("\n") == SECRET_DOC.count("\n")  # line breaks stay: line numbers still match
    assert out.splitlines()[1:6] == ["-----BEGIN RSA PRIVATE KEY-----", "<redacted>", "<redacted>", "<redacted>",
                                     "-----END RSA PRIVATE KEY-----"]
    assert f"AWS_ID = '<redacted>'" in out and 'aws_secret_access_key = "<redacted>"' in out
    assert '{"private_key": "-----BEGIN PRIVATE KEY-----<redacted>\\n-----END PRIVATE KEY-----\\n"}' in out
    kept = [line for line in SECRET_DOC.splitlines() if line.startswith(("import", "HEADER", "def", "    return"))]
    assert all(line in out.splitlines() for line in kept)  # no value there: untouched
    assert redact("x = 1\n") == "x = 1\n"
    assert FileFilter([Path("/")], IndexConfig()).content_is_secret(SECRET_DOC)  # the patterns the index uses


def test_redact_slices_finds_values_that_start_before_or_cross_a_slice():
    from indexer.files import redact_slices

    text = "-----BEGIN EC PRIVATE KEY-----\n" + "\n".join(PEM_BODY) + "\n-----END EC PRIVATE KEY-----\nk = 'AKIACANARY0123456789'\n"
    body_start = text.index(PEM_BODY[1])  # a slice starting inside the body: its BEGIN line is outside
    cursor = text.index("CANARY0123")  # and a slice boundary inside a token
    head, tail = redact_slices(text, [(body_start, cursor), (cursor, len(text))])
    assert head.startswith("<redacted>\n<redacted>\n-----END EC PRIVATE KEY-----\nk = '<redacted>")
    assert tail == "<redacted>'\n"
    assert not any(p in head + tail for p in PEM_BODY) and "CANARY" not in head + tail
    assert redact_slices(text, [(body_start, body_start)]) == [""]


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


def test_links_out_of_the_workspace_are_not_followed_unless_asked(workspace, tmp_path):
    """A cloned repository's link to one of the user's files (or directories) must not bring it into the
    index, by the walk or by a later change event. One within the workspace leads to a file indexed under
    its own path (the one the watcher reports), so the link is not followed either (a probe: the linked
    copy kept its old text after an edit of the target, and stayed after the target's deletion)."""
    outside = tmp_path / "home"
    write(outside, "credentials.py", "token = 'x'\n")
    write(outside, "lib/util.py", "def u():\n    pass\n")
    write(workspace, "pkg/mod.py", "def f():\n    pass\n")
    os.symlink(outside / "credentials.py", workspace / "creds.py")
    os.symlink(outside / "lib", workspace / "lib")
    os.symlink(workspace / "pkg" / "mod.py", workspace / "alias.py")  # inside: its target is indexed
    os.symlink(workspace / "pkg", workspace / "a_pkg")  # walked before pkg: the copy the walk kept
    files, skipped = walk(workspace)
    assert files == ["pkg/mod.py"]
    assert skipped["symlink_outside"] == 2 and skipped["symlink_inside"] == 2
    ff = FileFilter([workspace], IndexConfig())
    assert ff.path_reason(workspace / "creds.py") == "symlink_outside"
    assert ff.path_reason(workspace / "lib" / "util.py") == "symlink_outside"  # through a linked directory
    assert ff.path_reason(workspace / "alias.py") == "symlink_inside"
    assert ff.path_reason(workspace / "a_pkg" / "mod.py") == "symlink_inside"
    assert ff.path_reason(workspace / "pkg" / "mod.py") is None
    assert FileFilter([workspace], IndexConfig(follow_symlinks=False)).path_reason(workspace / "alias.py") == "symlink"
    files, _ = walk(workspace, symlinks_outside_roots=True)
    assert {"creds.py", "lib/util.py"} <= set(files)
    assert FileFilter([workspace], IndexConfig(symlinks_outside_roots=True)).path_reason(workspace / "creds.py") is None


def test_a_notebook_with_large_outputs_is_indexed_as_its_code(tmp_path):
    """A plot or two took a notebook past max_file_bytes and it was skipped whole for a few lines of code;
    its code cells are what must fit."""
    import json

    plot = {"output_type": "display_data", "data": {"image/png": "iVBORw0KGgo" * 30_000}}  # ~330 KB
    small = {"cells": [{"cell_type": "code", "source": "import pandas as pd\ndf = pd.read_csv('x.csv')\n",
                        "outputs": [plot]}]}
    big_code = {"cells": [{"cell_type": "code", "source": "x = 1\n" * 30_000, "outputs": []}]}
    (tmp_path / "plots.ipynb").write_text(json.dumps(small))
    (tmp_path / "huge.ipynb").write_text(json.dumps(big_code))
    (tmp_path / "data.py").write_text("y = 2\n" * 30_000)
    cfg = IndexConfig(cache_dir=tmp_path / ".cache", max_file_bytes=100_000)
    filt = FileFilter([tmp_path], cfg)
    walked = {Path(e.path).name for e in filt.walk().files}
    assert "plots.ipynb" in walked and "data.py" not in walked
    src, reason = filt.read(str(tmp_path / "plots.ipynb"))
    assert reason is None and src.text.startswith("import pandas as pd\n")
    assert filt.read(str(tmp_path / "huge.ipynb")) == (None, "too_large")  # its code is past the limit
