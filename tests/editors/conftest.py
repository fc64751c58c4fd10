"""Shared helpers for the editor tests: where the editors are, and the server environment (fake engine)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("DRAFTLINE_EDITORS_CACHE", Path.home() / ".cache" / "draftline-editors"))
PY = sys.executable


def server_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["DRAFTLINE_CACHE_DIR"] = str(Path(tempfile.gettempdir()) / "draftline-editors-cache")
    env["XDG_CONFIG_HOME"] = str(Path(tempfile.gettempdir()) / "draftline-editors-noconfig")
    return env


def nvim_011() -> str | None:
    cand = Path(PY).parent / "nvim"
    return str(cand) if cand.exists() else None


def nvim_012() -> str | None:
    cand = CACHE / "nvim-sid" / "bin" / "nvim"
    return str(cand) if cand.exists() else None


def which(name: str) -> str | None:
    return shutil.which(name)
