"""Exact KV reuse in CachedLM and the n-gram drafter's most-recent, longest match."""

from __future__ import annotations

import threading

import torch

from engine.drafters import HybridDrafter, ModelDrafter, NgramDrafter
from engine.speculative import generate
from engine.types import CompletionStats
from tests.unit.engine.conftest import cached, tiny_model


def _full_logits(model, tokens):
    with torch.inference_mode():
        return model(torch.tensor([tokens])).logits[0, -1]


def test_reused_prefix_logits_equal_a_full_recompute(llama):
    lm = cached(llama)
    base = list(range(5, 60))
    for tokens in (base, base[:30] + [1, 2, 3], base[:30] + [1, 2, 3, 4, 9], base[:10], base[:10]):
        logits, reused = lm.prefill(tokens)
        assert torch.allclose(logits, _full_logits(llama, tokens), atol=1e-5)
    assert reused == 9  # the identical prompt still re-runs its last token, for fresh logits
    lm.truncate(4)
    assert lm.tokens == base[:4]
    assert torch.allclose(lm.forward([77])[-1], _full_logits(llama, base[:4] + [77]), atol=1e-5)


def test_ngram_prefers_the_longest_then_the_most_recent_match():
    d = NgramDrafter(max_n=4)
    #            a  b  c  X  ...  a  b  c  Y  ...  b  c
    tokens = [1, 2, 3, 50, 51, 9, 1, 2, 3, 60, 61, 8, 2, 3]
    assert d.propose(tokens, 2) == [60, 61]  # "2 3" last seen before 60 (most recent)
    assert d.last_match == 2
    tokens2 = [1, 2, 3, 50, 51, 9, 7, 2, 3, 60, 61, 8, 1, 2, 3]
    assert d.propose(tokens2, 2) == [50, 51]  # "1 2 3" (longer) beats the more recent "2 3"
    assert d.last_match == 3


def test_ngram_grows_incrementally_and_uses_extra_sequences():
    d = NgramDrafter()
    seq = [4, 5, 6]
    assert d.propose(seq, 3) == []
    d.set_extra([[9, 4, 5, 6, 7, 8, 10]])  # a previous completion
    assert d.propose(seq, 3) == [7, 8, 10]
    seq += [7, 8, 4, 5, 6]
    assert d.propose(seq, 2) == [7, 8]  # now found in the sequence itself
    assert d.propose([1, 2], 2) == []  # a different sequence: rebuilt, no stale matches


def test_hybrid_uses_ngram_on_a_long_match_else_the_model(llama):
    draft = ModelDrafter(cached(tiny_model("llama", seed=7, layers=1, hidden=16)))
    h = HybridDrafter(NgramDrafter(), draft, min_match=2)
    h.propose([1, 2, 3, 4, 1, 2, 3], 3)
    assert h.last_used == "ngram"
    h.propose([10, 11, 12, 13], 3)
    assert h.last_used == "draft"


def test_sampling_is_reproducible_with_a_seed(llama):
    """A sampling draft draws from the generator it is given (the engine's, seeded from SpecConfig.seed),
    never from torch's global one: whatever else used that in between, a seed gives the same run."""
    draft = ModelDrafter(cached(tiny_model("llama", seed=7, layers=1, hidden=16)))
    draft.temperature = 1.5
    guesses, runs = [], []
    for run in range(2):
        draft.generator = torch.Generator().manual_seed(6)
        torch.manual_seed(100 + run)  # the global generator differs between the runs
        guesses.append(draft.propose([3, 4, 5, 6, 7], 8))
        draft.generator = torch.Generator().manual_seed(6)
        torch.manual_seed(200 + run)
        stats = CompletionStats()
        tokens, _ = generate(cached(llama), [3, 4, 5, 6], draft, max_new_tokens=20, cancel=threading.Event(),
                             temperature=0.8, generator=torch.Generator().manual_seed(5), stats=stats)
        runs.append((tokens, stats.proposed, stats.accepted))
    assert guesses[0] == guesses[1] and len(guesses[0]) == 8
    assert runs[0] == runs[1] and len(runs[0][0]) == 20 and sum(runs[0][1]) > 0
