"""Sliding-window models (Gemma 3, Mistral): transformers' config-built cache cannot crop a full
window, so CachedLM gives them a cache that keeps every layer's KV; drafts roll back and prompts
reuse their prefix as for any model, and the results equal a fresh run token for token."""

from __future__ import annotations

import random
import threading

import pytest
import torch

from engine.drafters import NgramDrafter
from engine.model import CachedLM
from engine.speculative import FixedGamma, generate
from engine.types import CompletionStats
from tests.unit.engine.conftest import CPU, naive_greedy

VOCAB, WINDOW = 300, 8


def _sharpen(model):
    with torch.no_grad():  # sharpen the random logits so greedy paths are not near-ties
        model.get_output_embeddings().weight.mul_(8.0)
    return model.eval()


def gemma3():
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(3)
    config = Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, sliding_window=WINDOW, max_position_embeddings=512,
        layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
    )
    return _sharpen(Gemma3ForCausalLM(config).float())


def mistral():
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(4)
    config = MistralConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, sliding_window=WINDOW, max_position_embeddings=512,
    )
    return _sharpen(MistralForCausalLM(config).float())


@pytest.fixture(scope="module", params=["gemma3", "mistral"])
def sliding(request):
    return {"gemma3": gemma3, "mistral": mistral}[request.param]()


@torch.inference_mode()
def fresh_logits(model, tokens: list[int]) -> torch.Tensor:
    """Logits of the last position from one forward without any cache (the model masks the window)."""
    return model(torch.tensor([tokens]), use_cache=False).logits[0, -1].float()


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, rtol=1e-5, atol=1e-4)


def _seq(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB) for _ in range(n)]


def test_the_config_built_cache_cannot_crop_a_full_window(sliding):
    """What crashed the engine on a real Gemma-3-270M: transformers' own crop once the window is full."""
    from transformers import DynamicCache

    cache = DynamicCache(config=sliding.config)
    with torch.inference_mode():
        sliding(torch.tensor([_seq(3 * WINDOW, 1)]), cache=cache, use_cache=True)
    with pytest.raises(RuntimeError):
        cache.crop(-2)


def test_the_window_matters_in_these_models(sliding):
    """Guards the tests below: a model that ignored its window would pass them trivially."""
    seq = _seq(4 * WINDOW, 2)
    windowed = fresh_logits(sliding, seq)
    sliding.config.sliding_window = 10_000
    try:
        sliding.model.config.sliding_window = 10_000
        unwindowed = fresh_logits(sliding, seq)
    finally:
        sliding.config.sliding_window = sliding.model.config.sliding_window = WINDOW
    assert not close(windowed, unwindowed)


def test_truncate_and_forward_equal_a_fresh_run(sliding):
    rng = random.Random(7)
    lm = CachedLM(sliding, CPU)
    seq = _seq(200, 2)
    lm.prefill(seq[:30])
    for _ in range(14):
        n = len(lm.tokens)
        cut = rng.choice([n - 1, n - 2, n - rng.randint(1, 6), rng.randint(2 * WINDOW, n - 1)])
        lm.truncate(max(cut, 2 * WINDOW))  # the windows stay full
        new = seq[len(lm.tokens): len(lm.tokens) + rng.randint(1, 9)]
        logits = lm.forward(new)
        assert logits.shape[0] == len(new)
        assert close(logits[-1], fresh_logits(sliding, lm.tokens)), len(lm.tokens)
        if rng.random() < 0.5:  # a different tail than the sequence's: positions after it then differ
            lm.forward([rng.randrange(VOCAB)])
            seq = lm.tokens + _seq(200, rng.randrange(1000))
    assert len(lm.tokens) > 3 * WINDOW


class WrongDrafter:
    """Proposes tokens the target never picks (its greedy choice + 1)."""

    name = "wrong"

    def __init__(self, truth: list[int], prompt_len: int, right: int = 0):
        self.truth, self.prompt_len, self.right = truth, prompt_len, right
        self.calls = 0

    def propose(self, tokens, k):
        pos = len(tokens) - self.prompt_len
        self.calls += 1
        right = self.right if self.calls % 3 else k  # now and then a fully right proposal
        return [(self.truth[pos + i] + (i >= right)) % VOCAB if pos + i < len(self.truth) else 0 for i in range(k)]

    def feedback(self, accepted, proposed):
        pass


def _run(lm, prompt, drafter, n, gamma=4):
    stats = CompletionStats()
    out, _ = generate(lm, prompt, drafter, max_new_tokens=n, cancel=threading.Event(), gamma=FixedGamma(gamma),
                      stats=stats)
    return out, stats


def test_speculation_on_a_sliding_model_equals_plain_greedy(sliding):
    prompt = _seq(12, 5) * 3  # repeats: the n-gram drafter has something to copy
    n = 40
    plain, _ = _run(CachedLM(sliding, CPU), prompt, None, n)
    assert plain == naive_greedy(sliding, prompt, n)
    out, stats = _run(CachedLM(sliding, CPU), prompt, NgramDrafter(), n)
    assert out == plain
    assert stats.proposed
    for right in (0, 2):
        out, stats = _run(CachedLM(sliding, CPU), prompt, WrongDrafter(plain, len(prompt), right), n)
        assert out == plain
        assert any(a < p for a, p in zip(stats.accepted, stats.proposed))  # rollbacks happened


def test_prefill_after_an_edit_in_the_middle_equals_a_fresh_model(sliding):
    lm = CachedLM(sliding, CPU)
    first = _seq(40, 6)
    logits, reused = lm.prefill(first)
    assert reused == 0 and close(logits, fresh_logits(sliding, first))
    second = first[:15] + [7, 8, 9] + first[20:]  # an edit in the middle: reuse crops the cache
    logits, reused = lm.prefill(second)
    assert reused == 15 and close(logits, fresh_logits(sliding, second))
    assert lm.tokens == second
