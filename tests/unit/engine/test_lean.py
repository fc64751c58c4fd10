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
def test_chunked_prefill_equals_one_forward(family):
    model = tiny_model(family, seed=7)
    ids = [(5 + 7 * i) % 90 for i in range(100)]
    whole, chunked = LeanLM(model, CPU, max_len=256, chunk=0), LeanLM(model, CPU, max_len=256, chunk=16)
    assert torch.allclose(whole.forward(ids), chunked.forward(ids), atol=1e-4)  # every position's logits
    assert chunked.forwards == 1 and chunked.tokens == ids
    for keep in (1, 16, 17, 40):  # logits wanted across a chunk boundary
        a, b = LeanLM(model, CPU, max_len=256, chunk=0), LeanLM(model, CPU, max_len=256, chunk=16)
        la, lb = a.forward(ids, keep_logits=keep), b.forward(ids, keep_logits=keep)
        assert lb.shape == (keep, la.shape[1]) and torch.allclose(la, lb, atol=1e-4), keep
    # a prefill that reuses a prefix and chunks the rest gives the same next-token logits
    chunked.truncate(30)
    logits, reused = chunked.prefill(ids + [3, 4])
    assert reused == 30 and torch.allclose(logits, whole.forward([3, 4])[-1], atol=1e-4)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_matmul_attention_equals_sdpa(family):
    model = tiny_model(family, seed=8)  # 4 query heads on 2 KV heads
    manual, sdpa = LeanLM(model, CPU, max_len=256), LeanLM(model, CPU, max_len=256)
    assert manual.manual_attention  # CPU's default; GPUs keep SDPA, checked here on the CPU
    sdpa.manual_attention = False
    for new in (list(range(3, 50)), [5, 6, 7, 8, 9], [10], list(range(60, 90))):  # prefill, verify, decode, chunk
        assert torch.allclose(manual.forward(new), sdpa.forward(new), atol=1e-5)


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
