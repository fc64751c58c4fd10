"""The real server on a first run in a hostile environment: a user config that is not UTF-8 text and a
cache directory that cannot be created. It must initialize, load its model and index (in memory)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest_lsp
from pytest_lsp import ClientServerConfig, LanguageClient

from tests.e2e.conftest import server_env
from tests.e2e.lsp_harness import initialize, wait_for

# made by the test before `initialize` (the server reads its config and opens its cache only then)
HOSTILE = Path(tempfile.gettempdir()) / f"draftline-envprobe-{os.getpid()}"


def hostile_env() -> dict[str, str]:
    env = server_env()
    env["XDG_CONFIG_HOME"] = str(HOSTILE / "config")
    env["DRAFTLINE_CACHE_DIR"] = str(HOSTILE / "a-file" / "cache")  # under a regular file: never creatable
    return env


@pytest_lsp.fixture(
    config=ClientServerConfig(server_command=[sys.executable, "-m", "lsp_server", "serve"], server_env=hostile_env())
)
async def hostile(lsp_client: LanguageClient):
    yield
    await lsp_client.shutdown_session()
    shutil.rmtree(HOSTILE, ignore_errors=True)


async def test_a_non_utf8_user_config_and_an_uncreatable_cache_still_give_a_model_and_an_index(
        hostile: LanguageClient, tmp_path: Path):
    (HOSTILE / "config" / "draftline").mkdir(parents=True)
    (HOSTILE / "config" / "draftline" / "config.toml").write_bytes(b'[completion]\nmode = "\xff"\n')
    (HOSTILE / "a-file").write_text("not a directory")
    root = tmp_path / "ws"
    root.mkdir()
    (root / "helpers.py").write_text("def compute_checksum(data):\n    return sum(data)\n")
    options = {"draftline": {"model": {"target": "fake"}, "index": {"options": {"embedder": "none"}}}}
    # was: initialize answered an internal error (UnicodeDecodeError) and no model ever loaded
    await initialize(hostile, init_options=options, roots=(root,))
    # was: "unavailable" (the store's directory could not be made), so no retrieval all session
    ready = await wait_for(hostile, lambda s: s["index"]["state"] in ("ready", "failed", "unavailable"))
    assert ready["index"]["state"] == "ready" and ready["index"]["files"] == 1


def test_python_m_lsp_server_in_a_project_with_its_own_engine_package_runs_draftlines(tmp_path: Path):
    for name in ("engine", "indexer"):  # a project's own packages by these common names
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f'raise ImportError("the project\'s own {name}")\n')
    env = {k: v for k, v in server_env().items() if k != "PYTHONSAFEPATH"}
    # an editor (Neovim's cmd_cwd, Emacs' default-directory) starts it in the project
    done = subprocess.run([sys.executable, "-m", "lsp_server", "--help"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]  # was: the project's ImportError
    assert done.stdout.startswith("usage: draftline")
