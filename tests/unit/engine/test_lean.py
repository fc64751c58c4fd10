"""The lean static-cache decoder matches transformers' logits and keeps speculation lossless."""

from __future__ import annotations

import threading

import pytest
import torch

from engine.drafters import ModelDrafter, NgramDrafter
from engine.lean import LeanLM
from engine.speculative import FixedGamma, generate
from tests.unit.engine.conftest import CPU, cached, naive_greedy, tiny_model


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_lean_logits_equal_transformers(family):
    model = tiny_model(family, seed=4)
    lean, ref = LeanLM(model, CPU, max_len=256), cached(model)
    seqs = [list(range(3, 40)), [5, 6, 7], [8], list(range(50, 60))]
    for new in seqs:  # prefill, then blocks like verify steps, then single steps
        a, b = lean.forward(new), ref.forward(new)
        assert torch.allclose(a, b, atol=1e-4), (a - b).abs().max()
    lean.truncate(20), ref.truncate(20)
    assert torch.allclose(lean.forward([9, 10]), ref.forward([9, 10]), atol=1e-4)
    logits, reused = lean.prefill(list(range(3, 30)))
    assert reused == 20 and torch.allclose(logits, ref.prefill(list(range(3, 30)))[0], atol=1e-4)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_speculation_on_the_lean_path_is_lossless(family):
    model = tiny_model(family, seed=5)
    draft = tiny_model("llama", seed=6, layers=1, hidden=16)
    prompt = [4, 9, 2, 33, 4, 9, 2, 17, 60, 61]
    truth = naive_greedy(model, prompt, 30)
    for drafter in (None, NgramDrafter(), ModelDrafter(LeanLM(draft, CPU, max_len=256))):
        tokens, _ = generate(LeanLM(model, CPU, max_len=256), prompt, drafter, max_new_tokens=30,
                             cancel=threading.Event(), gamma=FixedGamma(4))
        assert tokens == truth


def test_lean_refuses_what_it_cannot_run_exactly():
    model = tiny_model("llama")
    model.config.hidden_act = "gelu"
    with pytest.raises(ValueError, match="activation"):
        LeanLM(model, CPU)
