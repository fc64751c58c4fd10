"""`draftline bench lsp`: the retyping client against the real server (fake engine), and its arithmetic."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from lsp_server.bench.lsp import Run, Sample, pick_lines, run_bench, summarize

CODE = "import os\n\n\ndef first():\n    return 1\n\n\ndef join_paths(base, name):\n    return os.path.join(base, name)\n"


def _two_files(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.py").write_text(CODE)
    (ws / "b.py").write_text(CODE.replace("join_paths", "split_path").replace("os.path.join(base, name)", "base.split(name)"))
    return ws


def test_retyping_through_the_real_server_accounts_for_every_request(tmp_path: Path):
    ws = _two_files(tmp_path)
    tasks = pick_lines(ws, 5, seed=1)
    assert len(tasks) == 2 and all(t.text.strip() for t in tasks)
    settings = {"model": {"target": "fake", "options": {"step_s": 0.001}}, "completion": {"debounce_ms": 2},
                "index": {"enabled": False}}
    run = asyncio.run(run_bench(ws, tasks, keys_per_s=60, settings=settings, pause_s=20,
                                server=[sys.executable, "-m", "lsp_server", "serve"]))
    report = summarize(run, 60)
    typed = sum(len(t.text.strip()) for t in tasks)
    assert report["requests"] == typed and report["lines"] == 2
    assert report["answered"] + report["cancelled"] + report["errors"] == typed and report["errors"] == 0
    assert report["stale_answers"] == 0 and report["max_in_flight"] == 1
    assert report["engine_runs"] >= 1 and report["pause_p50_ms"] > 0
    assert sum(x.first for x in run.samples) == 2 and report["first_p50_ms"] > 0  # one cold request per opened file
    assert (tmp_path / "ws" / "a.py").read_text() == CODE  # the files on disk are never written


def test_revisit_goes_back_to_the_previous_file_where_its_cursor_was(tmp_path: Path):
    from tests.e2e.lsp_harness import fake_text

    ws = _two_files(tmp_path)
    tasks = pick_lines(ws, 5, seed=1)
    settings = {"model": {"target": "fake", "options": {"step_s": 0.001}}, "completion": {"debounce_ms": 2},
                "index": {"enabled": False}}
    run = asyncio.run(run_bench(ws, tasks, keys_per_s=60, settings=settings, pause_s=20,
                                server=[sys.executable, "-m", "lsp_server", "serve"], revisit=True))
    report = summarize(run, 60)
    back = [x for x in run.samples if x.revisit]
    assert len(back) == report["revisits"] == 1 and report["revisit_p50_ms"] > 0
    # the return repeats the file's last request: the suggestion cache answers it (the fake answers every prompt)
    assert not back[0].engine_ran and report["revisit_engine_runs"] == 0
    assert report["requests"] == sum(len(t.text.strip()) for t in tasks)  # not counted as typing
    first = tasks[0]  # the answer was computed at the end of the first file's retyped line, its text as on disk
    lines = first.path.read_text().split("\n")
    assert back[0].suggestion == fake_text("\n".join(lines[: first.line] + [lines[first.line]]))


def test_consecutive_lines_press_enter_and_await_each_new_line(tmp_path: Path):
    from tests.e2e.lsp_harness import fake_text

    ws = tmp_path / "ws"
    ws.mkdir()
    code = CODE + "\n\ndef split_path(base, name):\n    head = base.split(name)\n    return head[0]\n"
    (ws / "a.py").write_text(code)
    tasks = pick_lines(ws, 1, seed=0, consecutive=3)
    assert len(tasks) == 1 and tasks[0].count == 3
    task = tasks[0]
    settings = {"model": {"target": "fake", "options": {"step_s": 0.001}}, "completion": {"debounce_ms": 2},
                "index": {"enabled": False}}
    run = asyncio.run(run_bench(ws, tasks, keys_per_s=60, settings=settings, pause_s=20,
                                server=[sys.executable, "-m", "lsp_server", "serve"]))
    report = summarize(run, 60)
    lines = code.split("\n")
    typed = lines[task.line : task.line + 3]
    assert report["requests"] == sum(len(x.strip()) for x in typed) and report["errors"] == 0
    assert report["lines"] == sum(1 for x in typed if x.strip()) and report["stale_answers"] == 0
    newlines = [x for x in run.samples if x.newline]
    assert len(newlines) == report["newline_requests"] == 2 and report["newline_p50_ms"] > 0
    # each answer after Enter was computed on the document as typed so far: every earlier line back
    for j, sample in enumerate(newlines, start=1):
        line = typed[j]
        before = "\n".join(lines[: task.line + j]) + "\n" + line[: len(line) - len(line.lstrip(" "))]
        assert sample.suggestion == fake_text(before)


def test_summary_arithmetic():
    samples = [
        Sample(10, False, False, "text", suggestion="name)", rest="name)"),
        Sample(20, False, False, "text", suggestion="na", rest="name)"),
        Sample(90, True, False, "cancelled", rest="ame)"),
        Sample(30, False, False, "text", suggestion="other", rest="e)"),
        Sample(40, False, True, "empty"),
        Sample(900, False, False, "text", suggestion="x", rest="name)", first=True),  # kept apart from typing
        Sample(5, False, False, "text", suggestion="y", revisit=True, engine_ran=False),  # the suggestion cache's
        Sample(70, False, False, "text", suggestion="z", revisit=True),
    ]
    report = summarize(Run(samples=samples, status={"generations": {"max_in_flight": 1}}), 12)
    assert report["requests"] == 5 and report["answered"] == 4 and report["cancelled"] == 1
    assert report["p50_ms"] == 30 and report["p99_ms"] == 40 and report["pause_p50_ms"] == 40
    assert report["first_p50_ms"] == report["first_max_ms"] == 900
    assert report["in_time_share"] == 0.75 and report["pauses"] == 1  # 3 of the 4 keys within the line in time
    assert report["revisits"] == 2 and report["revisit_max_ms"] == 70
    assert report["revisit_engine_runs"] == 1 and report["revisit_engine_p50_ms"] == report["revisit_engine_max_ms"] == 70
    assert report["judged"] == 3 and report["matched_exactly"] == round(1 / 3, 4) and report["matched_prefix"] == round(2 / 3, 4)
