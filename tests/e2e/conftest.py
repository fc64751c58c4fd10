"""pytest-lsp fixture: the real `draftline serve` as a subprocess over stdio (FakeEngine via options)."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest_lsp
from lsprotocol.types import MessageType
from pytest_lsp import ClientServerConfig, LanguageClient

REPO = Path(__file__).resolve().parents[2]


def server_env() -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = os.pathsep.join(paths)  # works uninstalled too
    env["DRAFTLINE_CACHE_DIR"] = str(Path(tempfile.gettempdir()) / "draftline-e2e-cache")  # never ~/.cache
    env["XDG_CONFIG_HOME"] = str(REPO / "tests" / "e2e" / "_no_user_config")  # absent: no user TOML
    return env


@pytest_lsp.fixture(
    config=ClientServerConfig(server_command=[sys.executable, "-m", "lsp_server", "serve"], server_env=server_env())
)
async def client(lsp_client: LanguageClient):
    """A started, not yet initialized client; tests initialize with the profile and options they need."""
    yield
    await lsp_client.shutdown_session()  # no-op when the test never initialized
    unexpected = [m.message for m in lsp_client.messages if m.type == MessageType.Error and "failed to load" not in m.message]
    assert not unexpected, f"the server reported errors: {unexpected}"  # e.g. a handler that raised
