"""One training step of the pair: which models learn, and the draft distilled from a fixed target."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from engine.training.train import TrainConfig, _step

from .conftest import tiny_model


@pytest.mark.parametrize("models", [("target", "draft"), ("target",), ("draft",)])
def test_a_step_updates_exactly_the_models_it_trains(models):
    target, draft = tiny_model(seed=3).train(), tiny_model(seed=4, layers=1, hidden=16).train()
    for name, m in (("target", target), ("draft", draft)):
        m.requires_grad_(name in models)
    before = {n: [p.detach().clone() for p in m.parameters()] for n, m in (("target", target), ("draft", draft))}
    opt_t, opt_d = torch.optim.AdamW(target.parameters(), lr=1e-2), torch.optim.AdamW(draft.parameters(), lr=1e-2)
    x = torch.randint(0, 96, (2, 24))
    y = torch.randint(0, 96, (2, 24))
    y[:, :4] = -100  # padding is not trained on
    losses = _step(target, draft, x, y, TrainConfig(models=models), opt_t, opt_d)
    assert set(losses) == {"target", "draft", "kl"} - ({"target"} if "target" not in models else set()) - (
        {"draft", "kl"} if "draft" not in models else set())
    for name, m in (("target", target), ("draft", draft)):
        changed = any(not torch.equal(a, b) for a, b in zip(before[name], m.parameters()))
        assert changed == (name in models), name


def test_a_fresh_run_then_a_resume_write_loadable_models_and_a_summary(tmp_path):
    """The whole `draftline train` path on a tiny pair and a small corpus: fresh run, resume, load."""
    import json

    from engine.engine import load_engine
    from engine.training.train import train

    out = tmp_path / "models"
    cfg = TrainConfig(out=str(out), state=str(tmp_path / "state"), minutes=0.03, seq=128, batch=4, size="tiny",
                      device="cpu", max_chars=300_000, vocab=1024)
    first = train(cfg)
    assert first["steps"] > 0 and first["final"]["target_loss"] > 0
    second = train(replace(cfg, resume=True, size=None, models=("draft",), seed=1))
    summary = json.loads((out / "summary.json").read_text())
    assert [r["trained"] for r in summary["runs"]] == [["target", "draft"], ["draft"]]
    assert summary["steps"] == first["steps"] + second["steps"]
    assert summary["sizes"]["target"]["hidden"] == 64 and summary["sizes"]["draft"]["layers"] == 1
    assert (tmp_path / "state" / "optim.pt").exists() and not (out / "optim.pt").exists()
    engine = load_engine(str(out / "target"), str(out / "draft"), dtype="float32")
    assert engine.draft is not None and engine.target.tokenizer.convert_tokens_to_ids("<|fim_middle|>") > 0
    with pytest.raises(ValueError, match="does not match"):
        train(replace(cfg, resume=True, size="5m"))


def test_an_unknown_size_is_refused_before_any_work(tmp_path):
    from engine.training.train import train

    with pytest.raises(ValueError, match="unknown size"):
        train(TrainConfig(out=str(tmp_path), state=str(tmp_path), size="huge"))


def test_resume_without_a_checkpoint_is_refused_before_any_work(tmp_path):
    """--resume on an empty folder would have trained fresh random models (and a draft against an
    untrained target with --models draft) and loaded another run's optimizer state into them."""
    from engine.training.train import train

    with pytest.raises(ValueError, match="no checkpoint"):
        train(TrainConfig(out=str(tmp_path / "none"), state=str(tmp_path / "state"), resume=True, models=("draft",)))
    assert not (tmp_path / "none").exists()


def test_padding_is_masked_out_of_the_targets():
    import numpy as np

    from engine.training.train import _row_batch

    pad = 0
    rows = np.array([[5, 6, 7, pad, pad], [8, 9, pad, pad, pad]], dtype=np.int32)
    x, y = _row_batch(rows, TrainConfig(batch=8), np.random.default_rng(0), pad)
    assert x.shape == y.shape == (8, 4)
    for xi, yi in zip(x, y):  # every target that is padding is ignored, every other one kept
        full = next(r for r in rows.tolist() if r[:4] == xi.tolist())
        assert [t == -100 for t in yi.tolist()] == [t == pad for t in full[1:]]
