"""Shared helpers for the editor tests: where the editors are, and the server environment (fake engine)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

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


# --- CI: an editor that failed to install must not pass silently -------------------------------------
# Every skip in this folder means "that editor, Node or code-server is not installed": each test here is
# marked `needs_tool` (tests/conftest.py: under CI=true such a skip fails the run), and the run ends with
# a one-line count of the editor tests that ran.

SKIP_FAILS = os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")
_OUTCOMES = pytest.StashKey[dict[str, str]]()
HERE = Path(__file__).resolve().parent


def _outcomes(config: pytest.Config) -> dict[str, str]:
    return config.stash.setdefault(_OUTCOMES, {})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:  # the session's items: only this folder's are marked
        if HERE in item.path.resolve().parents:
            item.add_marker(pytest.mark.needs_tool)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # a skip is still a skip here (tests/conftest.py runs after)
    seen = _outcomes(item.config)
    if report.skipped and not hasattr(report, "wasxfail"):
        seen[item.nodeid] = "skipped"
    elif report.failed:
        seen[item.nodeid] = "failed"
    elif report.when == "call":
        seen.setdefault(item.nodeid, "passed")


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    seen = _outcomes(config)
    counts = {k: sum(v == k for v in seen.values()) for k in ("passed", "failed", "skipped")}
    terminalreporter.write_line(
        f"editor tests: {counts['passed'] + counts['failed']} run ({counts['passed']} passed, {counts['failed']} failed), "
        f"{counts['skipped']} skipped{' (CI=true: each skip failed the run)' if SKIP_FAILS and counts['skipped'] else ''}")
