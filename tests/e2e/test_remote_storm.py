"""`draftline bench lsp --storm`: a keystroke storm through model.remote against a server that fails on purpose.

The server (engine.sse_server, mode "storm") fails a share of its requests (500, stalls before the
headers and mid-stream, dropped connections, garbage, bad JSON) and answers the rest with a tag of
the cursor line it was asked about, so every answer the client would show is checked against the
document state it was shown for. No timing is asserted: the machine may be loaded.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

import engine.sse_server as sse_server
from lsp_server.bench.lsp import run_bench, storm, storm_tasks
from tests.e2e.conftest import server_env


@pytest.fixture(autouse=True)
def isolated_env(monkeypatch):
    """The bench starts the server with this process's environment: no user config, a test cache."""
    for name in ("DRAFTLINE_CACHE_DIR", "XDG_CONFIG_HOME", "PYTHONPATH"):
        monkeypatch.setenv(name, server_env()[name])


def test_a_storm_against_a_failing_server_has_no_stale_answer_no_hang_and_the_server_lives():
    report = asyncio.run(storm(None, keystrokes=150, fail_rate=0.1, keys_per_s=40, timeout_ms=300,
                               hang_margin_s=3.0, think_share=0.05))
    assert report["keystrokes"] >= 150 and report["requests"] == report["keystrokes"] + report["files"]
    assert report["stale_answers"] == 0 and report["late_answers"] == 0
    assert report["hangs"] == 0 and report["errors"] == 0
    assert report["answered"] + report["cancelled"] == report["requests"]  # nothing left unanswered
    assert report["server_alive"] and report["server_tracebacks"] == 0
    assert report["shown_checked"] > 0  # answers were shown, and each was checked against its line
    assert report["backend_failed"] > 0  # the server did fail (10 % of 150+ requests)
    assert report["ok"], report


def test_the_storm_sees_an_answer_computed_for_an_older_line(monkeypatch):
    """The check is not vacuous: a backend that answers for the line one keystroke back is caught."""
    real = sse_server.cursor_line
    monkeypatch.setattr(sse_server, "cursor_line", lambda body: real(body)[:-1])
    report = asyncio.run(storm(None, keystrokes=30, fail_rate=0.0, keys_per_s=40, timeout_ms=300, think_share=0.0))
    assert report["stale_answers"] > 0 and report["stale_answers"] == report["shown_checked"]
    assert not report["ok"]


def test_a_server_that_writes_a_lot_to_stderr_does_not_hang_the_bench(tmp_path: Path):
    """pygls' client pipes the server's stderr and never reads it; past ~128 KiB the run used to hang
    at the end (26 files against the flaky server: one httpx log line per request)."""
    tasks = storm_tasks(tmp_path, 10)[:1]
    noisy = ("import runpy, sys; sys.stderr.write(('x' * 99 + '\\n') * 3000); sys.stderr.flush(); "
             "sys.argv = ['draftline', 'serve']; runpy.run_module('lsp_server', run_name='__main__')")
    settings = {"model": {"target": "fake", "options": {"step_s": 0.001}}, "index": {"enabled": False}}
    run = asyncio.run(asyncio.wait_for(run_bench(tmp_path, tasks, keys_per_s=60, settings=settings, pause_s=10,
                                                 server=[sys.executable, "-c", noisy]), 60))
    assert run.server_alive and len(run.samples) == len(tasks[0].text.strip()) + 1
    assert run.server_log and run.server_log[-1]  # the drained tail is kept for reports
