"""`draftline bench gpu` on the CPU with a tiny shape: every part runs and reports, and its arithmetic holds.

The numbers that matter come from a GPU run; this is what makes that one run safe to spend device time on.
"""

from __future__ import annotations

import json

import pytest
import torch

from engine.bench import gpu
from lsp_server.cli import main


def test_the_bench_runs_every_part_on_a_tiny_shape(tmp_path, capsys):
    out = tmp_path / "gpu.json"
    rc = main(["bench", "gpu", "--shapes", "tiny", "--device", "cpu", "--dtype", "float32", "--contexts", "40,80",
               "--ks", "2,4", "--steps", "2", "--reps", "1", "--exact-steps", "8", "--copy-mib", "4",
               "--pair", "tiny:tiny", "--compile", "tiny", "--compile-backend", "aot_eager", "--json", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["ks"] == [1, 2, 4] and res["bandwidth_GBps"] > 0
    (shape,) = res["shapes"]
    errors = {k: v for k, v in shape.items() if isinstance(v, dict) and "error" in v}
    assert not errors
    compiled = shape["compiled"]  # the compiled forward timed, and checked against the eager one
    assert set(compiled["decode_ms"]) == {"40", "80"} and compiled["compiled_vs_eager_max_diff"] < 1e-4
    for key in ("transformers_decode_ms", "lean_decode_ms", "graphs_decode_ms", "padded_decode_ms",
                "padded_whole_decode_ms", "floor_ms"):
        assert set(shape[key]) == {"40", "80"} and all(v > 0 for v in shape[key].values()), key
    for label in ("lean", "graphs"):
        steps = shape[f"{label}_verify_steps"]["80"]
        assert steps["1"] == 1.0 and set(steps) == {"1", "2", "4", "tree13"}
    assert shape["prompt_tokens"]["80"] < 80  # the measured forwards end within the context
    assert shape["graph_vs_eager_max_diff"] < 1e-4  # float32: the graphed forward is the eager one
    for key in ("exactness", "exactness_eager", "exactness_padded", "exactness_padded_whole", "exactness_fp32_head"):
        e = shape[key]
        assert e["k2"]["verifies"] == 7 and e["k4"]["verifies"] == 5  # a verify from every step of 8
        assert e["k2"]["verifies_differing"] == 0  # float32 on the CPU: verify rows are decode steps
    proj = res["projection"]["80"]
    assert proj["draft_step_over_target_step"] == pytest.approx(1.0)
    assert {"a=0.37", "a=0.6", "a=0.8"} <= set(proj)
    text = capsys.readouterr().out
    assert "decode ms/token" in text and "projection tiny:tiny" in text


def test_unknown_shapes_are_refused_and_the_cpu_needs_them_named(capsys):
    assert main(["bench", "gpu", "--shapes", "tiny,gpt-9"]) == 2
    assert "gpt-9" in capsys.readouterr().err
    assert main(["bench", "gpu", "--device", "cpu"]) == 2
    assert "no GPU here" in capsys.readouterr().err


def test_projection_arithmetic():
    draft = {"graphs_verify_ms": {"512": {"1": 1.0}}}
    target = {"graphs_verify_ms": {"512": {"1": 10.0}}, "graphs_verify_steps": {"512": {"1": 1.0, "2": 1.0, "4": 1.2}}}
    row = gpu.project(draft, target, [1, 2, 4], [0.0, 0.5])["512"]
    assert row["draft_step_over_target_step"] == 0.1
    # acceptance 0: one token a verify; gamma 1 costs 0.1 + 1.0 steps
    assert row["a=0.0"] == {"gamma": 1, "speedup": round(1 / 1.1, 2)}
    # acceptance 0.5: gamma 1 gives 1.5 tokens for 1.1 steps, gamma 3 gives 1.875 for 1.5 steps
    assert row["a=0.5"] == {"gamma": 1, "speedup": round(1.5 / 1.1, 2)}


def test_weight_bytes_count_what_a_step_reads():
    model = gpu.build("tiny", torch.device("cpu"), torch.float32)  # tied head: the embeddings are read as the head
    from engine.lean import LeanLM

    lm = LeanLM(model, torch.device("cpu"), max_len=64)
    assert gpu.weight_bytes(lm) == sum(p.numel() * p.element_size() for p in model.parameters())
    assert gpu.kv_bytes(lm, 10) == 2 * 2 * 2 * 10 * 16 * 4  # layers, K and V, KV heads, positions, head dim, fp32
