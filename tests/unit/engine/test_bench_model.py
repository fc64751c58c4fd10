"""`draftline bench model`: held-out loss by position, agreement and exact-match samples."""

from __future__ import annotations

import json

from engine.bench.model import position_losses
from lsp_server.cli import main


def test_position_losses_split_the_window_into_buckets(model_dirs):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dirs["target"]))
    losses = position_losses(model, [list(range(10, 40)) * 10], buckets=(0, 100, 200, 400))
    assert set(losses) == {"0-100", "100-200", "200-400"}
    assert all(v > 0 for v in losses.values())


def test_bench_model_reports_losses_agreement_and_samples(model_dirs, capsys):
    rc = main(["bench", "model", "--target", str(model_dirs["target"]), "--draft", str(model_dirs["draft"]),
               "--windows", "1", "--tasks", "4", "--samples", "1", "--json"])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["loss_by_position"]) == {"target", "draft"}
    assert 0.0 <= report["top1_agreement"] <= 1.0
    assert set(report["exact_match"]) == set(report["first_word"]) == set(report["parses"]) == {"completion", "infill"}
    assert set(report["bare_exact_match"]) == set(report["bare_edit_similarity"]) == {"completion", "infill"}
    assert all(0.0 <= v <= 1.0 for v in report["edit_similarity"].values())
    assert all(0.0 <= v <= 1.0 for v in report["parses"].values())
    assert [s["kind"] for s in report["samples"]] == ["completion", "infill"]
    assert all(s["real"] for s in report["samples"])


def test_edit_similarity():
    from engine.bench.model import _edit_similarity

    assert _edit_similarity("return x", " return x ") == 1.0
    assert _edit_similarity("", "") == 1.0 and _edit_similarity("abc", "") == 0.0
    assert 0.5 < _edit_similarity("return self.x", "return self.y") < 1.0


def test_parses_tells_valid_python_from_a_broken_line():
    from engine.bench.model import _parses

    assert _parses("def f(x):\n    return x + 1\n")
    assert not _parses("def f(x):\n    return (x + \n")
    assert not _parses("x = '\0'\x00")  # a null byte is a ValueError in ast.parse, not a crash


def test_line_start_infills_put_the_cursor_at_column_0_and_count_the_indentation(model_dirs, capsys):
    rc = main(["bench", "model", "--target", str(model_dirs["target"]), "--windows", "1", "--tasks", "6",
               "--samples", "3", "--no-bare", "--line-start", "--unhealed-line-start", "--json"])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    assert report["infill_cursor"] == "column 0" and report["line_start_healing"] is False
    infills = [s for s in report["samples"] if s["kind"] == "infill"]
    # the whole line is the answer: nothing of it before the cursor (the context shown is the cursor's line)
    assert infills and all(s["context"] == "" for s in infills)


def test_exact_match_counts_the_indentation_only_where_the_answer_brings_it():
    from engine.bench.model import _score
    from engine.types import CompletionRequest

    req = CompletionRequest(prefix="def f():\n", suffix="\n")
    assert _score("", "return 1", "    return 1", req)["exact"]
    assert not _score("", "return 1", "    return 1", req, indent_counts=True)["exact"]
    assert _score("", "    return 1", "    return 1", req, indent_counts=True)["exact"]
