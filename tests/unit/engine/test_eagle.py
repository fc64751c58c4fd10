"""The EAGLE draft: the lean layer computes what the training module computes, speculation with it is
lossless, its cache follows the target's, its file format refuses what it cannot run, and training
lowers its loss."""

from __future__ import annotations

import dataclasses
import threading

import pytest
import torch

from engine.eagle import EagleDrafter, EagleLM, load, parse_eagle_draft, save, unit_rms
from engine.lean import LeanLM
from engine.speculative import AdaptiveGamma, FixedGamma, generate
from engine.training.eagle import EagleDraftModule, EagleTrainConfig, _Frozen, _loss, evaluate, features
from engine.types import CompletionRequest, Limits
from tests.unit.engine.conftest import CPU, tiny_model

PROMPTS = [[4, 9, 2, 33, 4, 9, 2, 17, 60, 61], [1, 2, 3], list(range(10, 50))]


def _model(quant: str, seed: int = 21):
    model = tiny_model("llama", seed=seed, layers=3, hidden=64)
    return model.to(torch.bfloat16) if quant in ("int8", "int4") else model


def _target(model, quant: str = "none") -> LeanLM:
    return LeanLM(model, CPU, max_len=256, quant=quant)


def _module(target: LeanLM, seed: int = 5, std: float = 0.2) -> EagleDraftModule:
    torch.manual_seed(seed)
    m = EagleDraftModule(int(target.embed.shape[1]), target.n_heads, target.n_kv, target.head_dim, target.ffn, target.eps)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 2:
                p.normal_(0, std)
    return m


def _draft(target: LeanLM, ids=None, seed: int = 5) -> EagleLM:
    ids = torch.arange(target.rows) if ids is None else torch.as_tensor(ids)
    return EagleLM(target, _module(target, seed).tensors(), ids)


def test_the_lean_layer_computes_the_training_module():
    target = _target(_model("none"))
    module = _module(target)
    lm = EagleLM(target, module.tensors(), torch.arange(target.rows))
    torch.manual_seed(0)
    n = 13
    feats = torch.randn(n, target.embed.shape[1]) * 7.0  # raw features: the draft normalizes them
    toks = torch.randint(0, target.rows, (n,))
    # prefill, a decode-sized step and a verify-sized block: the per-token and the batched attention
    for a, b in ((0, 7), (7, 8), (8, 13)):
        lm.forward_pairs(toks[a:b].tolist(), feats[a:b])
    with torch.no_grad():
        want = module(unit_rms(feats, target.eps)[None], target.embed[toks][None], target.cos[:n], target.sin[:n])[0]
    assert torch.allclose(lm.hidden[:n], want, atol=1e-4), (lm.hidden[:n] - want).abs().max()
    # its logits are the target's final norm and head over the guessed feature
    fz = _Frozen(target, torch.arange(target.rows))
    got = lm.forward_pairs([int(toks[0])], feats[:1])[-1]
    assert torch.allclose(got, fz.logits(lm.hidden[n : n + 1].float())[0], atol=1e-3)


def test_the_second_pass_of_training_is_the_drafts_second_guess():
    """Training's second pass (pair p reads a guessed feature and attends to the true pairs before
    it) computes what the lean draft computes for its second guess."""
    target = _target(_model("none"))
    module = _module(target)
    torch.manual_seed(1)
    n = 9
    feats = unit_rms(torch.randn(n, target.embed.shape[1]), target.eps)
    guessed = unit_rms(torch.randn(n, target.embed.shape[1]), target.eps)
    toks = torch.randint(0, target.rows, (n,))
    with torch.no_grad():
        _, g2 = module(feats[None], target.embed[toks][None], target.cos[:n], target.sin[:n], feats2=guessed[None])
    for p in (0, 4, n - 1):
        lm = EagleLM(target, module.tensors(), torch.arange(target.rows))
        if p:
            lm.forward_pairs(toks[:p].tolist(), feats[:p])
        lm.forward_pairs([int(toks[p])], guessed[p : p + 1])
        assert torch.allclose(lm.hidden[p], g2[0, p], atol=1e-4), p


@pytest.mark.parametrize("quant", ["none", "int8", "int4"])
def test_speculation_with_an_eagle_draft_equals_plain_greedy(quant):
    model = _model(quant)
    for prompt in PROMPTS:
        plain, _ = generate(_target(model, quant), prompt, None, max_new_tokens=30, cancel=threading.Event())
        for gamma in (FixedGamma(3), AdaptiveGamma()):
            target = _target(model, quant)
            drafter = EagleDrafter(target, _draft(target))
            tokens, _ = generate(target, prompt, drafter, max_new_tokens=30, cancel=threading.Event(), gamma=gamma)
            assert tokens == plain, (prompt, gamma)
            assert drafter.lm.forwards > 0


def test_the_drafts_cache_follows_the_target():
    """A draft that drafted along a whole generation holds what a fresh one computes from the
    target's features (pairs of guessed features are never kept)."""
    model = _model("none")
    target = _target(model)
    warm = EagleDrafter(target, _draft(target))
    prompt = PROMPTS[2]
    tokens, _ = generate(target, prompt, warm, max_new_tokens=40, cancel=threading.Event(), gamma=FixedGamma(4))
    seq = prompt + tokens
    target.truncate(len(seq) - 1)  # the loop's state: the cache holds all but the pending token
    fresh = EagleDrafter(target, _draft(target))
    assert warm.propose(seq, 4) == fresh.propose(seq, 4)
    n = len(seq) - 1
    assert warm.lm.tokens == fresh.lm.tokens == seq[1:]
    assert torch.allclose(warm.lm.hidden[:n], fresh.lm.hidden[:n], atol=1e-4)
    # an edit in the middle: the draft recomputes from there
    edited = seq[:20] + [7, 7] + seq[22:]
    target.prefill(edited[:-1])
    fresh2 = EagleDrafter(target, _draft(target))
    assert warm.propose(edited, 3) == fresh2.propose(edited, 3)
    assert torch.allclose(warm.lm.hidden[:n], fresh2.lm.hidden[:n], atol=1e-4)


def test_the_drafter_proposes_nothing_it_cannot_read_features_for():
    target = _target(_model("none"))
    drafter = EagleDrafter(target, _draft(target))
    assert drafter.propose([1, 2, 3], 3) == []  # the target holds nothing
    target.prefill([1, 2, 3])
    assert drafter.propose([1, 2, 3, 4], 0) == []
    assert drafter.propose([9, 9, 9, 4], 3) == []  # not the target's tokens
    assert len(drafter.propose([1, 2, 3, 4], 3)) == 3
    # a plain forward (benchmarks time one) reads the target's features at its positions
    lm = _draft(target)
    a = lm.forward([2, 3], keep_logits=1)
    lm.reset()
    assert torch.equal(a, lm.forward_pairs([2, 3], target.hidden[:2]))


def test_a_cancel_during_the_catch_up_stops_it_between_chunks():
    """A first request's catch-up runs the whole prompt's pairs: with the request's cancel flag it runs in
    the decoder's chunks and stops between them, and the pairs done serve the next call."""
    target = LeanLM(_model("none"), CPU, max_len=256, chunk=64)
    drafter = EagleDrafter(target, _draft(target))
    prompt = [(7 * i + 3) % 96 for i in range(200)]
    target.prefill(prompt[:-1])
    event = threading.Event()
    real = drafter.lm.forward_pairs

    def forward_pairs(tokens, feats, keep=1):
        event.set()  # cancelled while the draft runs its first chunk
        return real(tokens, feats, keep)

    drafter.lm.forward_pairs, drafter.cancel = forward_pairs, event
    assert drafter.propose(prompt, 4) == [] and len(drafter.lm.tokens) == 64
    del drafter.lm.forward_pairs
    event.clear()
    fresh = EagleDrafter(target, _draft(target))
    assert drafter.propose(prompt, 4) == fresh.propose(prompt, 4)
    assert drafter.lm.tokens == fresh.lm.tokens == prompt[1:]
    assert torch.allclose(drafter.lm.hidden[:199], fresh.lm.hidden[:199], atol=1e-5)


def test_the_head_drafts_only_its_ids():
    target = _target(_model("none"))
    ids = list(range(0, 96, 3))
    drafter = EagleDrafter(target, _draft(target, ids))
    target.prefill(PROMPTS[0][:-1])
    guess = drafter.propose(PROMPTS[0], 5)
    assert guess and set(guess) <= set(ids)


def test_file_round_trip_and_refusals(tmp_path):
    target = _target(_model("none"))
    module = _module(target)
    path = tmp_path / "d.safetensors"
    save(path, module.tensors(), torch.tensor([3, 1, 2]), {"target": "tiny"})
    tensors, ids, meta = load(path)
    assert ids.tolist() == [3, 1, 2] and meta["target"] == "tiny" and meta["format"] == 1
    assert all(torch.equal(tensors[k], v.to(torch.bfloat16)) for k, v in module.tensors().items())
    with pytest.raises(ValueError, match="no such file"):
        load(tmp_path / "missing.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="cannot read"):
        load(tmp_path / "junk.safetensors")
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(2)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(ValueError, match="not a draftline EAGLE draft"):
        load(tmp_path / "other.safetensors")
    other = _target(tiny_model("llama", seed=3, layers=2, hidden=32))
    with pytest.raises(ValueError, match="trained for another model"):
        EagleLM(other, tensors, ids)
    with pytest.raises(ValueError, match="vocabulary"):
        EagleLM(target, tensors, torch.tensor([5, 1000]))


def test_parse_eagle_draft():
    from engine.eagle import SHIPPED

    assert parse_eagle_draft("eagle") == SHIPPED
    assert str(parse_eagle_draft("eagle:/x/y.safetensors")) == "/x/y.safetensors"
    assert parse_eagle_draft("") is None and parse_eagle_draft("self:4") is None and parse_eagle_draft("eagle:") is None


def test_load_engine_with_an_eagle_draft(model_dirs, tmp_path):
    from engine.engine import load_engine
    from engine.selfdraft import tokenizer_hash

    probe = load_engine(str(model_dirs["target"]), backend="lean")
    path = tmp_path / "eagle.safetensors"
    save(path, _module(probe.target_lm).tensors(), torch.arange(probe.target_lm.rows),
         {"target": "tiny", "tokenizer": tokenizer_hash(probe.target.tokenizer)})
    engine = load_engine(str(model_dirs["target"]), f"eagle:{path}", backend="lean")
    assert isinstance(engine.draft_lm, EagleLM) and engine.model_drafter.lm is engine.draft_lm
    assert engine.hybrid.model is engine.model_drafter
    request = CompletionRequest(prefix="def main(argv):\n    for x in argv:\n        ", limits=Limits(max_tokens=24))
    plain = engine.complete(request, threading.Event(), engine.config.spec.with_overrides(target_only=True))
    for drafter in ("draft", "hybrid"):
        engine.forget()
        spec = dataclasses.replace(engine.config.spec.with_overrides(gamma=3), drafter=drafter)
        res = engine.complete(request, threading.Event(), spec)
        assert res.tokens == plain.tokens and res.stats.draft_forwards > 0
    with pytest.raises(ValueError, match="lean decoder"):
        load_engine(str(model_dirs["target"]), f"eagle:{path}", backend="transformers")
    save(path, _module(probe.target_lm).tensors(), torch.arange(10), {"target": "other", "tokenizer": "0" * 24})
    with pytest.raises(ValueError, match="tokenizer"):
        load_engine(str(model_dirs["target"]), f"eagle:{path}", backend="lean")


def test_training_lowers_the_loss_and_raises_agreement():
    """A few hundred steps on the features of a tiny target over a repetitive stream."""
    torch.manual_seed(0)
    target = _target(_model("none"))
    import numpy as np

    rng = np.random.default_rng(0)
    motif = [int(t) for t in rng.integers(0, 96, size=37)]
    stream = (motif * 40)[:1200]
    toks, feats = features(target, stream, 64, 1.0, rng)
    assert toks.shape == (len(stream) // 64 - 1, 64) and feats.shape == (*toks.shape, 64)
    assert feats.dtype == torch.bfloat16
    ids = torch.arange(96)
    fz = _Frozen(target, ids)
    cfg = EagleTrainConfig(batch=4, noise=0.0)
    model = _module(target, std=0.02)
    before = evaluate(model, fz, ids, toks[:4], feats[:4], cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(150):
        pick = torch.arange(4) + 4 * (step % max(1, len(toks) // 4 - 1))
        loss, _ = _loss(model, fz, toks[pick % len(toks)], feats[pick % len(toks)], cfg, 0.0, steps=1 + step % 2)
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = evaluate(model, fz, ids, toks[:4], feats[:4], cfg)
    assert after["ce"] < before["ce"] - 1.0
    assert after["top1_agreement"] > max(0.5, before["top1_agreement"])


def test_bench_agreement_counts_the_drafters_first_guesses():
    """bench selfdraft's teacher-forced agreement for an EAGLE draft equals asking the drafter for
    one guess at each position of the answer."""
    from engine.bench.selfdraft import _eagle_agreement

    target = _target(_model("none"))
    lm = _draft(target)
    prompt, answer = PROMPTS[2][:20], [int(t) for t in torch.randint(0, 96, (12,), generator=torch.Generator().manual_seed(3))]
    matches, n = _eagle_agreement(lm, target, prompt, answer)
    drafter = EagleDrafter(target, _draft(target))
    want = 0
    for j in range(1, len(answer)):
        target.prefill(prompt + answer[: j - 1])
        want += int(drafter.propose(prompt + answer[:j], 1) == [answer[j]])
    assert n == len(answer) - 1 and matches == want


def test_a_self_draft_never_writes_the_targets_features():
    from engine.selfdraft import SelfDraftLM

    target = _target(_model("none"))
    target.prefill(PROMPTS[2])
    before = target.keep_hidden().clone()
    draft = SelfDraftLM(target, 1)
    draft.forward(PROMPTS[2])
    assert draft.hidden is None and torch.equal(target.hidden, before)


def test_cached_features_are_used_only_for_the_target_they_were_made_from(tmp_path):
    from engine.training.eagle import cached_features

    made = {"target": "/m/smollm2", "window": 256, "hidden": 576, "vocab": 49152}
    path = tmp_path / "feats.pt"
    assert cached_features(path, made) is None  # no file yet
    torch.save({"toks": torch.zeros(1), "made_from": made}, path)
    assert cached_features(path, made)["made_from"] == made
    assert cached_features(path, {**made, "target": "/m/other"}) is None  # another target: computed again
    assert cached_features(path, {**made, "window": 512}) is None
    torch.save({"toks": torch.zeros(1)}, path)  # a file from before the record
    assert cached_features(path, made) is None
