"""CI=true turns the skip of a test that needs an installed tool (`needs_tool`, tests/conftest.py) into a failure:
the editor tests here and the llama-server e2e test alike, while the editor count line still counts it as a skip."""

from __future__ import annotations

import os
import subprocess

from tests.editors.conftest import PY, REPO


def pytest_run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=240)


def ci_env(tmp_path, ci: str) -> dict[str, str]:
    # an empty cache: no llama-server and no Neovim 0.12 there
    return dict(os.environ) | {"CI": ci, "DRAFTLINE_EDITORS_CACHE": str(tmp_path / "empty-cache")}


def test_ci_fails_a_llama_server_test_whose_tool_is_missing(tmp_path):
    test = "tests/e2e/test_remote_llama_server.py::test_a_completion_from_llama_server"
    run = pytest_run(test, env=ci_env(tmp_path, "true"))
    out = run.stdout + run.stderr
    assert run.returncode == 1, out[-3000:]
    assert "CI=true: a test that needs an installed tool may not skip" in out and "llama-server not installed" in out, out[-3000:]
    local = pytest_run(test, env=ci_env(tmp_path, ""))  # outside CI it is a skip, as before
    assert local.returncode == 0 and "1 skipped" in local.stdout, (local.stdout + local.stderr)[-3000:]


def test_ci_fails_an_editor_test_and_still_counts_it_as_skipped(tmp_path):
    run = pytest_run("tests/editors/test_nvim.py::test_nvim_012_inline_completion", env=ci_env(tmp_path, "true"))
    out = run.stdout + run.stderr
    assert run.returncode == 1, out[-3000:]
    assert "Neovim 0.12 absent" in out, out[-3000:]
    assert "editor tests: 0 run (0 passed, 0 failed), 1 skipped (CI=true: each skip failed the run)" in out, out[-3000:]
