"""One training step of the pair: which models learn, and the draft distilled from a fixed target."""

from __future__ import annotations

import pytest
import torch

from engine.train import TrainConfig, _step

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
