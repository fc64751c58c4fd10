"""Self-speculation: the target's first layers and head as the draft, sharing its weights, lossless."""

from __future__ import annotations

import copy
import threading

import pytest
import torch

from engine.drafters import ModelDrafter
from engine.lean import LeanLM
from engine.selfdraft import SelfDraftLM, head_ids, parse_self_draft, token_ranking
from engine.speculative import AdaptiveGamma, FixedGamma, generate
from engine.types import CompletionRequest, Limits
from tests.unit.engine.conftest import CPU, tiny_model

PROMPTS = [[4, 9, 2, 33, 4, 9, 2, 17, 60, 61], [1, 2, 3], list(range(10, 50))]


def _model(quant: str, layers: int = 4, seed: int = 21):
    model = tiny_model("llama", seed=seed, layers=layers, hidden=64)
    return model.to(torch.bfloat16) if quant in ("int8", "int4") else model


def _target(model, quant: str) -> LeanLM:
    return LeanLM(model, CPU, max_len=256, quant=quant)


@pytest.mark.parametrize("quant", ["none", "int8", "int4"])
@pytest.mark.parametrize("layers,head", [(1, None), (3, None), (2, list(range(0, 96, 2)))])
def test_speculation_with_a_self_draft_equals_plain_greedy(quant, layers, head):
    model = _model(quant)
    for prompt in PROMPTS:
        plain, _ = generate(_target(model, quant), prompt, None, max_new_tokens=30, cancel=threading.Event())
        for gamma in (FixedGamma(4), AdaptiveGamma()):
            # a fresh target each time: a reused bf16 prompt would end in a decode step, not the prefill's kernel
            target = _target(model, quant)
            draft = SelfDraftLM(target, layers, head)
            tokens, _ = generate(target, prompt, ModelDrafter(draft), max_new_tokens=30, cancel=threading.Event(),
                                 gamma=gamma)
            assert tokens == plain, (prompt, layers, gamma)
            assert draft.forwards > 0


@pytest.mark.parametrize("layers", [1, 2, 3])
def test_self_draft_logits_equal_the_truncated_model(layers):
    model = _model("none")
    truncated = copy.deepcopy(model)  # the first N layers, the final norm and the head
    truncated.model.layers = truncated.model.layers[:layers]
    truncated.config.num_hidden_layers = layers
    draft = SelfDraftLM(_target(model, "none"), layers)
    seq = [5, 17, 3, 88, 41, 2, 9, 9, 60, 1, 33, 70]
    got = torch.cat([draft.forward(seq[:7]), draft.forward(seq[7:9]), draft.forward([seq[9]]), draft.forward(seq[10:])])
    with torch.inference_mode():
        want = truncated(torch.tensor([seq])).logits[0].float()
    assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()
    # and the full target is not what the draft computes (N < all layers)
    with torch.inference_mode():
        assert not torch.allclose(got, model(torch.tensor([seq])).logits[0].float(), atol=1e-2)


@pytest.mark.parametrize("quant", ["none", "int8", "int4"])
def test_restricted_head_is_minus_inf_outside_its_ids(quant):
    model = _model(quant)
    target = _target(model, quant)
    ids = [0, 3, 5, 17, 40, 41, 95]
    full, part = SelfDraftLM(target, 2), SelfDraftLM(target, 2, ids)
    seq = [4, 9, 2, 33, 4, 9, 2, 17]
    for new in (seq, [5], [6, 7, 8]):  # prefill, a decode step, a verify-sized block
        a, b = full.forward(new), part.forward(new)
        assert b.shape == a.shape == (len(new), 96)
        outside = torch.ones(96, dtype=torch.bool)
        outside[ids] = False
        assert torch.isneginf(b[:, outside]).all() and torch.isfinite(b[:, ids]).all()
        assert torch.allclose(b[:, ids], a[:, ids], atol=1e-4 if quant == "none" else 1e-2)
    # the draft proposes only ids of its head
    proposal = ModelDrafter(SelfDraftLM(target, 2, ids)).propose(seq, 5)
    assert proposal and set(proposal) <= set(ids)
    # a tree of drafts too
    toks, parents = ModelDrafter(SelfDraftLM(target, 2, ids)).propose_tree(seq, 6, 3, 2)
    assert toks and set(toks) <= set(ids)


@pytest.mark.parametrize("quant", ["none", "int8"])
def test_self_draft_shares_the_targets_weights_and_not_its_cache(quant):
    model = _model(quant)
    target = _target(model, quant)
    draft = SelfDraftLM(target, 2, [1, 2, 3])
    assert len(draft.layers) == 2 and len(target.layers) == 4
    for mine, theirs in zip(draft.layers, target.layers):
        for a, b in zip(mine, theirs):
            assert a is b
            t = a if isinstance(a, torch.Tensor) else a.w
            assert t.data_ptr() == (b if isinstance(b, torch.Tensor) else b.w).data_ptr()
            if not isinstance(a, torch.Tensor) and quant == "int8":
                assert a.q.data_ptr() == b.q.data_ptr()
    assert draft.embed.data_ptr() == target.embed.data_ptr()
    assert draft.final_norm.data_ptr() == target.final_norm.data_ptr()
    assert draft.cos.data_ptr() == target.cos.data_ptr()
    assert SelfDraftLM(target, 2).lm_head is target.lm_head  # the full head: the target's own
    # its own cache: running the draft leaves the target's logits and state as they were
    assert draft.kv.data_ptr() != target.kv.data_ptr() and draft.kv.shape[0] == 2
    alone = _target(model, quant)  # the same calls without a draft beside it
    seq = list(range(3, 20))
    assert torch.equal(target.forward(seq), alone.forward(seq))
    draft.forward(seq)
    draft.forward([50, 51, 52])
    draft.truncate(5)
    draft.forward([60, 61])
    assert target.tokens == seq and draft.tokens == seq[:5] + [60, 61]
    target.truncate(10), alone.truncate(10)
    assert torch.equal(target.forward(seq[10:]), alone.forward(seq[10:]))
    assert torch.equal(target.forward([70]), alone.forward([70]))


def test_self_draft_refuses_what_it_cannot_be():
    target = _target(_model("none"), "none")
    with pytest.raises(ValueError, match="1 to 3"):
        SelfDraftLM(target, 4)
    with pytest.raises(ValueError, match="1 to 3"):
        SelfDraftLM(target, 0)
    with pytest.raises(ValueError, match="lean decoder"):
        SelfDraftLM(object(), 1)
    with pytest.raises(ValueError, match="head_ids"):
        SelfDraftLM(target, 1, [96])


def test_parse_self_draft():
    assert parse_self_draft("self:8") == (8, None)
    assert parse_self_draft("self:8:4096") == (8, 4096)
    assert parse_self_draft("self:8:full") == (8, None)
    assert parse_self_draft("/models/draft") is None and parse_self_draft("") is None
    for bad in ("self:", "self:x", "self:0", "self:4:0", "self:4:5:6", "self:4:k"):
        with pytest.raises(ValueError, match="self:N"):
            parse_self_draft(bad)


def test_token_ranking_counts_and_head_ids(tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    texts = ["def f(x):\n    return x\n"] * 5 + ["import os\n"]
    ranking = token_ranking(tok, texts=texts)
    assert sorted(ranking["ranking"]) == list(range(len(tok)))  # every id, once
    assert ranking["counts"] == sorted(ranking["counts"], reverse=True)
    assert ranking["tokens"] == sum(len(tok.encode(t, add_special_tokens=False)) for t in texts)
    top = ranking["ranking"][0]
    assert top in tok.encode(texts[0], add_special_tokens=False)
    ids = head_ids(tok, 4, ranking=ranking)
    assert set(ranking["ranking"][:4]) <= set(ids.tolist())
    assert set(tok.all_special_ids) <= set(ids.tolist())  # the end tokens stay draftable
    assert ids.tolist() == sorted(ids.tolist())


def test_load_engine_self_draft(model_dirs, monkeypatch):
    from engine import selfdraft
    from engine.engine import load_engine

    engine = load_engine(str(model_dirs["target"]), "self:1", backend="lean")
    assert isinstance(engine.draft_lm, SelfDraftLM) and engine.draft_lm.target is engine.target_lm
    assert engine.model_drafter.lm is engine.draft_lm and engine.hybrid.model is engine.model_drafter
    request = CompletionRequest(prefix="def main(argv):\n    for x in argv:\n        ", limits=Limits(max_tokens=24))
    plain = engine.complete(request, threading.Event(), engine.config.spec.with_overrides(target_only=True))
    for drafter in ("draft", "hybrid"):
        engine.forget()
        spec = engine.config.spec.with_overrides(gamma=3)
        import dataclasses

        res = engine.complete(request, threading.Event(), dataclasses.replace(spec, drafter=drafter))
        assert res.tokens == plain.tokens and res.stats.draft_forwards > 0
    # "self:N:K": a head over the K most frequent ids (the ranking faked here, no corpus read)
    monkeypatch.setattr(selfdraft, "token_ranking", lambda tok: {"ranking": list(range(len(tok)))[::-1]})
    engine = load_engine(str(model_dirs["target"]), "self:1:50", backend="lean")
    assert engine.draft_lm.head_ids is not None and 50 <= len(engine.draft_lm.head_ids) < engine.target.vocab_size
    res = engine.complete(request, threading.Event())
    assert res.tokens == plain.tokens
    with pytest.raises(ValueError, match="lean decoder"):
        load_engine(str(model_dirs["target"]), "self:1", backend="transformers")
    with pytest.raises(ValueError, match="1 to 1"):
        load_engine(str(model_dirs["target"]), "self:2", backend="lean")
