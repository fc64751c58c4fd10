"""`draftline bench engine --json` prints every mode with the agreed keys, all identical to plain."""

from __future__ import annotations

import json

from lsp_server.cli import main


def test_bench_engine_json(model_dirs, capsys):
    rc = main(["bench", "engine", "--target", str(model_dirs["target"]), "--draft", str(model_dirs["draft"]),
               "--prompts", "2", "--max-new", "12", "--prompt-chars", "600", "--json"])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    assert {"device", "target", "draft", "modes"} <= report.keys()
    names = [m["name"] for m in report["modes"]]
    assert names == ["plain", "hf-assisted", "hf-prompt-lookup", "ngram-g5", "ngram-adaptive", "draft-g5",
                     "draft-adaptive", "hybrid-g5", "hybrid-adaptive"]
    for m in report["modes"]:
        assert {"tokens_per_s", "ms_per_token", "acceptance", "accepted_per_step", "speedup", "identical"} <= m.keys()
        assert m["identical"] is True, m["name"]
    assert report["modes"][0]["speedup"] == 1.0


def test_bench_quant_json(model_dirs, capsys):
    """`draftline bench quant`: every arm decodes and verifies; the dense arm agrees with itself throughout."""
    rc = main(["bench", "quant", "--target", str(model_dirs["target"]), "--prompts", "2", "--max-new", "6",
               "--prompt-chars", "300", "--verify", "3", "--json"])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    torch_arms = ["int8-torch", "int4-torch"] if report["native"] else []
    assert report["prompts"] == 2 and list(report["arms"]) == ["none", "int8", "int4", *torch_arms]
    for arm in report["arms"].values():
        assert arm["decode_ms_per_token"] > 0 and arm["verify_3_rows_ms"] > 0
    assert report["arms"]["int8"]["vs_int8"] == 1.0
    assert report["greedy_reference"] == "none"
    assert report["arms"]["none"]["tokens_equal_to_none_before_first_difference"] == 6
    assert report["arms"]["none"]["teacher_forced_kl_from_none"] == 0.0  # the reference against itself
    assert report["arms"]["none"]["teacher_forced_top1_equal_to_none"] == 1.0
    for arm in report["arms"].values():
        assert arm["teacher_forced_kl_from_none"] >= 0.0 and 0.0 <= arm["teacher_forced_top1_equal_to_none"] <= 1.0
    prefill = report["prefill"]
    assert prefill["bf16_ms"] > 0 and prefill["float32_ms"] > 0 and prefill["prompt_tokens_mean"] > 0
    if report["native"]:  # the native prefill attention against torch's
        assert prefill["bf16_torch_attention_ms"] > 0 and prefill["native_attention_over_torch"] > 0
    import engine.lean as lean

    assert prefill["default"] == ("float32" if lean.dense_in_float32() else "bf16")  # the bench put the switch back
