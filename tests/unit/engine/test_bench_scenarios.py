"""`draftline bench scenarios`: held-out tasks of each kind, every mode identical to plain, plots and table."""

from __future__ import annotations

import json

from lsp_server.bench.scenarios import SPEC_MODES, degenerate, make_tasks, markdown_table, modes_table
from lsp_server.cli import main


def test_tasks_are_cut_from_held_out_code_with_the_servers_stop_rules():
    tasks = make_tasks(2, seed=0, scenarios=("single-line", "function", "refactor"))
    kinds = {t.scenario for t in tasks}
    assert kinds == {"single-line", "function", "refactor"}
    for t in tasks:
        assert t.path.startswith(("json", "email", "asyncio", "logging", "pygls", "watchdog")) or "/" in t.path
        if t.scenario == "single-line":
            assert t.request.mode == "single-line" and t.request.limits.max_lines == 1
        else:
            assert t.request.mode == "multi-line" and t.request.limits.min_indent >= 1
    refactor = next(t for t in tasks if t.scenario == "refactor")
    assert "V2" in refactor.request.prefix.rsplit("\n", 3)[-2] and refactor.request.limits.max_tokens >= 1000


def test_refactor_tasks_fit_the_models_context_when_a_tokenizer_is_given():
    tasks = make_tasks(3, seed=0, scenarios=("refactor",), count_tokens=len, room=4000)  # characters as tokens
    assert tasks
    for t in tasks:
        header = t.request.prefix.rsplit("\n", 2)[-2]  # the renamed class's first line
        name = header.split()[1].split("(")[0].rstrip(":")[: -len("V2")]
        start = t.request.prefix.index(f"class {name}")
        original = t.request.prefix[start:].split("\n\n# ", 1)[0]
        assert 800 <= len(original) <= 4000 - 64 + 2, len(original)


def test_the_oracle_drafter_is_always_right_and_changes_nothing(model_dirs):
    import threading

    from engine.engine import load_engine
    from lsp_server.bench.scenarios import OracleDrafter

    engine = load_engine(str(model_dirs["target"]), str(model_dirs["draft"]), dtype="float32")
    req = make_tasks(1, seed=0, scenarios=("function",))[0].request
    plain = engine.complete(req, threading.Event(), SPEC_MODES["plain"])
    engine.forget()
    res = engine.complete(req, threading.Event(), OracleDrafter.SPEC,
                          drafter=OracleDrafter(plain.tokens, plain.stats.prompt_tokens))
    assert res.tokens == plain.tokens and len(plain.tokens) > 2
    assert res.stats.proposed and res.stats.accepted == res.stats.proposed  # every guess kept
    assert res.stats.target_forwards < len(plain.tokens)


def test_previous_keystroke_is_one_character_less_and_windows_are_the_servers():
    from lsp_server.bench.scenarios import SERVER, previous_keystroke

    tasks = make_tasks(3, seed=1, scenarios=("single-line", "function"))
    for t in tasks:
        assert len(t.request.prefix) <= SERVER.prefix_chars and len(t.request.suffix) <= SERVER.suffix_chars
        prev = previous_keystroke(t.request)
        assert prev.prefix == t.request.prefix[:-1] and prev.suffix == t.request.suffix and prev.uri == t.request.uri


def test_degenerate_means_a_line_or_block_three_times_in_a_row():
    assert degenerate("a = 1\nb\nb\n\nb\n") and not degenerate("a\nb\na\nb\n")
    assert degenerate("x = 0\nif a:\n    return\n\nif a:\n    return\nif a:\n    return\n")  # blanks ignored
    assert not degenerate("if a:\n    return 1\nif b:\n    return 2\nif c:\n    return 3\n")


def test_bench_scenarios_json_plots_and_table(model_dirs, tmp_path, capsys):
    rc = main(["bench", "scenarios", "--target", str(model_dirs["target"]), "--draft", str(model_dirs["draft"]),
               "--n", "1", "--scenarios", "single-line,function", "--json", "--plot", str(tmp_path)])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["scenarios"]) == {"single-line", "function"}
    assert report["headline_cache"] == "warm"
    for name, data in report["scenarios"].items():
        assert set(data["modes"]) == set(SPEC_MODES) | {"oracle"}, name
        assert data["modes"] == data["by_cache"]["warm"] and set(data["by_cache"]) == {"warm", "cold"}
        for cache, modes in data["by_cache"].items():
            for mode, cell in modes.items():
                assert {"p50_ms", "speedup", "acceptance", "identical"} <= cell.keys()
                assert cell["identical"] is True, (name, mode, cache)
                assert cell["identical_checked"] == data["tasks"] == 1  # degenerate tasks are checked too
        warm, cold = data["prompt"]["warm"], data["prompt"]["cold"]  # over every task, degenerate or not
        assert cold["recomputed_mean"] == cold["tokens_mean"] > 0
        assert warm["recomputed_mean"] < warm["tokens_mean"] / 4  # warm: only what the keystroke changed
    costs = report["costs"]
    assert costs["context"] > 0 and set(costs["verify_cost"]) == {"1", "2", "4", "8", "16"}  # JSON keys
    assert costs["verify_cost"]["1"] == 1.0 and costs["draft_forward_ms"] > 0 and costs["draft_cost_ratio"] > 0
    for png in ("acceptance_by_position.png", "speedup.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "table.md").read_text().startswith("| task |")
    assert "verify cost" in (tmp_path / "table.md").read_text()
    assert markdown_table(report).count("\n| ") == 2
    assert modes_table(report).count("\n| ") == 2 * (len(SPEC_MODES) + 1)  # every mode, oracle included
    assert "| single-line | plain |" in modes_table(report)
