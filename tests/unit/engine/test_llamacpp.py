"""The optional llama.cpp backend keeps the seam's contract; skipped where llama-cpp-python is absent.

GGUF conversion needs llama.cpp's converter from the llama-cpp-python sdist ($DRAFTLINE_LLAMACPP_SRC,
or a copy extracted into ~/.cache/draftline/gguf earlier); without it those tests skip too.
"""

from __future__ import annotations

import json
import sys
import threading

import pytest
import torch

from engine.drafters import ModelDrafter, NgramDrafter
from engine.speculative import FixedGamma, generate


def test_missing_extra_says_how_to_install(monkeypatch):
    from engine import llamacpp

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import fails as if not installed
    with pytest.raises(ImportError, match=r"draftline\[llamacpp\]"):
        llamacpp.import_llama_cpp()


@pytest.fixture(scope="module")
def ggufs(model_dirs, tmp_path_factory):
    pytest.importorskip("llama_cpp")
    from engine import llamacpp

    try:
        converter = llamacpp.find_converter()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    cache = tmp_path_factory.mktemp("xdg")
    mp = pytest.MonkeyPatch()
    mp.setenv("XDG_CACHE_HOME", str(cache))  # converted files stay out of the user's cache
    try:
        files = {name: llamacpp.gguf_for(d, "f32", src=converter.parent) for name, d in model_dirs.items()}
        yield {**files, "converter": converter}
    finally:
        mp.undo()


def _lm(path, **kw):
    from engine.llamacpp import LlamaCppLM

    return LlamaCppLM(path, n_ctx=512, n_threads=1, **kw)


def test_truncate_then_forward_equals_a_from_scratch_forward(ggufs):
    lm = _lm(ggufs["target"])
    prompt = list(range(10, 60))
    assert lm.forward(prompt).shape[0] == len(prompt)
    assert lm.forward([7, 8, 9], keep_logits=1).shape[0] == 1
    lm.forward([11, 12, 13, 14])
    assert len(lm.tokens) == len(prompt) + 7 and lm.forwards == 3
    lm.truncate(30)
    assert lm.tokens == prompt[:30]
    after = lm.forward([5, 6, 7])
    fresh = _lm(ggufs["target"]).forward(prompt[:30] + [5, 6, 7])[-3:]
    assert torch.allclose(after, fresh, atol=1e-5), (after - fresh).abs().max()
    logits, reused = lm.prefill(prompt[:30] + [5, 6, 7, 40])
    assert reused == 33 and torch.allclose(logits, _lm(ggufs["target"]).forward(prompt[:30] + [5, 6, 7, 40])[-1],
                                           atol=1e-5)
    lm.reset()
    assert lm.tokens == [] and torch.allclose(lm.forward([3, 4])[-1], _lm(ggufs["target"]).forward([3, 4])[-1])


def test_logits_match_the_torch_model(ggufs, model_dirs):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dirs["target"], dtype=torch.float32).eval()
    ids = list(range(20, 80))
    with torch.inference_mode():
        ref = model(torch.tensor([ids])).logits[0]
    got = _lm(ggufs["target"], kv_type="f32").forward(ids)
    assert torch.allclose(got, ref, atol=1e-3, rtol=1e-3), (got - ref).abs().max()


def test_vocab_limit_slices_logits(ggufs):
    lm = _lm(ggufs["target"], vocab_limit=50)
    assert lm.forward([3, 4, 5]).shape == (3, 50)


def test_speculation_on_llamacpp_equals_its_own_greedy(ggufs):
    prompt = [4, 9, 2, 33, 4, 9, 2, 17, 60, 61, 4, 9, 2]
    truth, _ = generate(_lm(ggufs["target"]), prompt, None, max_new_tokens=40, cancel=threading.Event())
    target = _lm(ggufs["target"])
    for drafter in (NgramDrafter(), ModelDrafter(_lm(ggufs["draft"])), None):
        for gamma in (1, 3, 6):
            tokens, _ = generate(target, prompt, drafter, max_new_tokens=40, cancel=threading.Event(),
                                 gamma=FixedGamma(gamma))
            assert tokens == truth, (type(drafter).__name__, gamma)


def test_engine_backend_llamacpp(ggufs, model_dirs, monkeypatch):
    from engine.engine import EngineConfig, load_engine
    from engine.llamacpp import LlamaCppLM
    from engine.types import CompletionRequest, Limits, SpecConfig

    monkeypatch.setenv("DRAFTLINE_LLAMACPP_THREADS", "1")
    engine = load_engine(str(model_dirs["target"]), str(model_dirs["draft"]), config=EngineConfig(backend="llamacpp"))
    assert isinstance(engine.target_lm, LlamaCppLM) and isinstance(engine.draft_lm, LlamaCppLM)
    request = CompletionRequest(prefix="import json\n\ndef load(path):\n    ", limits=Limits(max_tokens=24))
    outs = []
    for drafter in ("none", "ngram", "hybrid", "draft"):
        engine.target_lm.reset()
        engine.draft_lm.reset()
        engine.history.clear()
        outs.append(engine.complete(request, threading.Event(), SpecConfig(drafter=drafter)).tokens)
    assert all(o == outs[0] for o in outs)


def test_bench_peers_json(ggufs, model_dirs, capsys):
    from lsp_server.cli import main

    converter_dir = ggufs["converter"].parent
    rc = main(["bench", "peers", "--target", str(model_dirs["target"]), "--draft", str(model_dirs["draft"]),
               "--prompts", "1", "--max-new", "8", "--prompt-chars", "600", "--threads", "1",
               "--llamacpp-src", str(converter_dir), "--json"])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    assert {"llamacpp-plain", "llamacpp-prompt-lookup", "draftline-plain", "draftline[llamacpp]-plain",
            "draftline-hybrid-adaptive", "draftline[llamacpp]-ngram-adaptive"} <= report["engines"].keys()
    for name, e in report["engines"].items():
        assert {"ms_per_token", "prefill_ms", "speedup_vs_llamacpp", "identical_to_own_greedy"} <= e.keys()
        assert e["identical_to_own_greedy"] is True, name


class _RowsDiffer:
    """A LeanLM whose forwards of several tokens come out slightly off, as llama.cpp's batched
    kernels do on a quantized GGUF; marked for the engine's row probe like LlamaCppLM."""

    rows_need_probe = True

    def __init__(self, lm, offset: float):
        self._lm, self.offset = lm, offset

    def __getattr__(self, name):
        return getattr(self._lm, name)

    def forward(self, new_tokens, keep_logits=None):
        out = self._lm.forward(new_tokens, keep_logits)
        return out + self.offset if len(new_tokens) > 1 else out

    def prefill(self, tokens, cancel=None):
        from engine.model import prefill_reusing

        return prefill_reusing(self, tokens, cancel)


def test_the_row_probe_measures_batched_against_single_rows(model_dirs):
    from engine.engine import load_engine
    from engine.model import batched_rows_differ

    lm = load_engine(str(model_dirs["target"]), None, dtype="float32").target_lm  # the lean decoder
    ids = [(7 * i) % 90 + 3 for i in range(60)]
    assert batched_rows_differ(_RowsDiffer(lm, 0.0), ids) < 1e-4  # float32 lean: the same up to rounding
    assert batched_rows_differ(_RowsDiffer(lm, 0.25), ids) == pytest.approx(0.25, abs=1e-3)
    assert lm.tokens == []  # the probe leaves the cache empty


@pytest.mark.parametrize("offset", [0.0, 0.25])
def test_a_backend_whose_batched_rows_differ_gets_no_speculation(model_dirs, monkeypatch, offset):
    import engine.engine as engine_mod
    from engine.types import CompletionRequest, Limits, SpecConfig

    real = engine_mod.make_lm
    monkeypatch.setattr(engine_mod, "make_lm", lambda *a, **kw: _RowsDiffer(real(*a, **kw), offset))
    # int8 rows on the lean decoder are bit-exact alone or together: the probe finds 0.0 without the offset
    engine = engine_mod.load_engine(str(model_dirs["target"]), None, dtype="bfloat16", quant="int8")
    request = CompletionRequest(prefix="def f(a, b):\n    return a + b\n\ndef g(a, b):\n    return ", limits=Limits(max_tokens=12))
    result = engine.complete(request, threading.Event(), SpecConfig(drafter="ngram"))
    if offset:
        assert "differ from one-at-a-time decoding" in engine.speculation_off
        assert engine.drafter_for(SpecConfig(drafter="ngram")) is None
        assert result.stats.target_forwards == result.stats.generated_tokens  # one forward a token: plain
    else:
        assert engine.speculation_off == "" and engine.drafter_for(SpecConfig(drafter="ngram")) is engine.ngram
