"""The lean static-cache decoder matches transformers' logits and keeps speculation lossless."""

from __future__ import annotations

import threading

import pytest
import torch

from engine.drafters import ModelDrafter, NgramDrafter
from engine.lean import LeanLM, dense_linear
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


def _bf16(model):
    return model.to(torch.bfloat16)


@pytest.mark.parametrize("quant,tolerance", [("int8", 0.05), ("int4", 0.2)])
def test_quantized_rows_have_the_same_bits_alone_or_together(quant, tolerance):
    """What keeps int8/int4 speculation lossless: a verify forward's row equals that row decoded alone."""
    from engine.lean import INT8_MAX_ROWS, Linear

    torch.manual_seed(0)
    lin = Linear(torch.randn(96, 64, dtype=torch.bfloat16), quant=quant)
    assert lin.int4 == (quant == "int4")
    x = torch.randn(INT8_MAX_ROWS, 64, dtype=torch.bfloat16)
    together = lin(x)
    assert all(torch.equal(together[i], lin(x[i : i + 1])[0]) for i in range(INT8_MAX_ROWS))
    dense = torch.nn.functional.linear(x.float(), lin.w.float())
    assert (together.float() - dense).abs().max() < tolerance * dense.abs().max()  # close to the dense weights
    long = torch.randn(INT8_MAX_ROWS + 1, 64, dtype=torch.bfloat16)
    assert torch.equal(lin(long), dense_linear(long, lin.w))  # prefill chunks use the dense weights


@pytest.mark.parametrize("fp32", [True, False])
def test_long_bf16_matmuls_run_in_float32_where_the_cpu_has_no_bf16_gemm(monkeypatch, fp32):
    """A CPU without oneDNN bf16 kernels (AVX2) takes prefill chunks in float32, rounded back to bf16;
    decode and verify rows keep their kernels either way (the bits speculation relies on)."""
    import engine.lean as lean

    monkeypatch.setattr(lean, "_FP32_DENSE", fp32)
    torch.manual_seed(1)
    w = torch.randn(48, 64, dtype=torch.bfloat16)
    long = torch.randn(lean.INT8_MAX_ROWS + 1, 64, dtype=torch.bfloat16)
    in32 = torch.nn.functional.linear(long.float(), w.float()).to(torch.bfloat16)
    in16 = torch.nn.functional.linear(long, w)
    got = lean.dense_linear(long, w)
    assert got.dtype == torch.bfloat16 and torch.equal(got, in32 if fp32 else in16)
    assert torch.allclose(got.float(), in16.float(), rtol=0.02, atol=0.02 * in16.abs().max().item())
    short = long[: lean.INT8_MAX_ROWS]
    assert torch.equal(lean.dense_linear(short, w), torch.nn.functional.linear(short, w))
    for quant in ("none", "int8", "int4"):
        lin = lean.Linear(w, quant=quant)
        assert torch.equal(lin(long), got)  # every recipe's long rows take the dense path


def test_the_float32_switch_follows_the_environment(monkeypatch):
    import engine.lean as lean

    for value, want in (("1", True), ("0", False)):
        monkeypatch.setattr(lean, "_FP32_DENSE", None)
        monkeypatch.setenv("DRAFTLINE_DENSE_FP32", value)
        assert lean.dense_in_float32() is want
    monkeypatch.setattr(lean, "_FP32_DENSE", None)
    monkeypatch.delenv("DRAFTLINE_DENSE_FP32")
    assert lean.dense_in_float32() is (not torch.ops.mkldnn._is_mkldnn_bf16_supported())


def test_int4_leaves_what_its_kernel_cannot_take_to_int8():
    from engine.lean import Linear

    odd = Linear(torch.randn(40, 48, dtype=torch.bfloat16), quant="int4")  # K not a multiple of 32
    assert not odd.int4 and odd.q.dtype == torch.int8
    x = torch.randn(3, 48, dtype=torch.bfloat16)
    assert torch.equal(odd(x), torch._weight_int8pack_mm(x, odd.q, odd.s))


def test_a_packed_pair_of_the_other_recipe_is_recomputed():
    """A cache written under one recipe (int8 head) read under another (int4 head) must not reach the kernel."""
    from engine.lean import Linear

    w = torch.randn(64, 64, dtype=torch.bfloat16)
    as8, as4 = Linear(w, quant="int8"), Linear(w, quant="int4")
    assert torch.equal(Linear(w, quant="int4", packed=(as8.q, as8.s)).q, as4.q)
    assert torch.equal(Linear(w, quant="int8", packed=(as4.q, as4.s)).q, as8.q)


@pytest.mark.parametrize("quant", ["int8", "int4"])
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_quantized_speculation_equals_plain_greedy_of_the_same_weights(family, quant):
    model = _bf16(tiny_model(family, seed=5, hidden=64))
    draft = _bf16(tiny_model("llama", seed=6, layers=1, hidden=32))
    prompt = [4, 9, 2, 33, 4, 9, 2, 17, 60, 61] * 4

    def run(drafter, gamma=4):
        lm = LeanLM(model, CPU, max_len=256, quant=quant)
        return generate(lm, prompt, drafter, max_new_tokens=40, cancel=threading.Event(), gamma=FixedGamma(gamma))[0]

    plain = run(None)
    for drafter in (NgramDrafter(), ModelDrafter(LeanLM(draft, CPU, max_len=256, quant=quant))):
        for gamma in (1, 4, 16):
            assert run(drafter, gamma) == plain
    dense = LeanLM(model, CPU, max_len=256)  # quantization changes the weights a little, not the model
    packed = LeanLM(model, CPU, max_len=256, quant=quant)
    if quant == "int4":  # every linear but the head, which stays int8
        assert packed.lm_head.q.dtype == torch.int8 and all(layer[1].int4 and layer[5].int4 for layer in packed.layers)
    a, b = dense.forward(prompt[:8]), packed.forward(prompt[:8])
    assert torch.allclose(a, b, atol=(0.1 if quant == "int8" else 0.25) * a.abs().max().item())


def test_int8_needs_bfloat16_on_the_cpu():
    with pytest.raises(ValueError, match="bfloat16"):
        LeanLM(tiny_model("llama"), CPU, quant="int8")
    with pytest.raises(ValueError, match="quant"):
        LeanLM(tiny_model("llama"), CPU, quant="int3")


def _odd_llama(**over):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    cfg = dict(vocab_size=97, hidden_size=64, intermediate_size=100, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=512)
    cfg.update(over)
    return LlamaForCausalLM(LlamaConfig(**cfg)).eval()


@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_a_linear_no_int8_kernel_can_take_stays_dense(quant):
    """An ffn of 100 (K % 16 != 0): the native kernels take blocks of 32 and torch's int8 kernel gave NaN
    for one row and crashed the process for several on an AVX-512 CPU; such a linear stays dense."""
    model = _odd_llama().to(torch.bfloat16)
    lm, ref = LeanLM(model, CPU, max_len=128, quant=quant), LeanLM(model, CPU, max_len=128)
    down = lm.layers[0][5]
    assert down.q is None  # dense
    prompt = list(range(3, 40))
    lm.prefill(prompt), ref.prefill(prompt)
    for rows in ([5], [6, 7, 8, 9]):  # decode and verify rows (the int8 paths)
        got, want = lm.forward(rows), ref.forward(rows)
        assert torch.isfinite(got).all() and (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.5


def test_heads_that_do_not_share_kv_heads_evenly_are_refused():
    """6 query heads over 4 KV heads: the kernels' head -> KV head map would read past the cache."""
    from engine.lean import supports

    model = _odd_llama(hidden_size=96, num_attention_heads=6, num_key_value_heads=4)
    assert "6 attention heads over 4 KV heads" in supports(model)
    with pytest.raises(ValueError, match="KV heads"):
        LeanLM(model, CPU, max_len=64, quant="int8")


def test_a_float16_model_runs_on_torchs_ops_on_the_cpu():
    """The native kernels take float32 and bfloat16: with float16 every request failed."""
    model = _odd_llama(intermediate_size=128).to(torch.float16)
    lm = LeanLM(model, CPU, max_len=128)
    assert not lm.native
    assert torch.isfinite(lm.forward(list(range(3, 40)))).all() and torch.isfinite(lm.forward([5, 6, 7])).all()
