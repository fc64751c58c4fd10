"""`draftline bench index-yield`: both arms run, interleaved, and report what they measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.bundled import DEFAULT_PACKAGE, default_target
from lsp_server.cli import main

pytestmark = pytest.mark.skipif(default_target() is None, reason=f"{DEFAULT_PACKAGE} is not installed")


def test_bench_index_yield_reports_both_arms(capsys):
    tree = Path(__file__).parents[2] / "demo"
    assert main(["bench", "index-yield", str(tree), "--gap-ms", "0", "--idle-s", "0", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["no_build_ms_per_token_p50"] > 0
    assert [a["yielding"] for a in report["arms"]] == [False, True]
    assert all(a["build_s"] >= 0 and a["answers"] >= 0 for a in report["arms"])
