"""A lean Llama/Qwen2 decoder with a static KV cache: the same seam as CachedLM, less overhead.

Weights come from the loaded transformers model (same HF directory). Q/K/V and gate/up are fused
into single matrices, RoPE tables are precomputed, and the KV cache is one preallocated tensor per
layer indexed by position, so rejection and cross-keystroke reuse are a length change. On this
CPU a transformers forward costs ~0.55 ms of fixed overhead (reference/bakeoff.md §4); for the
small models draftline runs here that overhead is most of a step.

On the CPU, `quant="int8"` (bf16 models) keeps int8 per-row copies of the linears for forwards of up
to INT8_MAX_ROWS tokens (decode, verify), and those forwards attend one query token at a time in
float32: every row of a verify forward is then the very computation of a decode step, bit for bit,
which keeps greedy speculation identical to plain decoding. `prefill` (the engine's prompts) runs in
forwards of at most INT8_MAX_ROWS tokens too (`prefill_rows`), so a prompt position gets the same bits
from a cold prefill, a warm prompt's few new tokens or a decode step, and a request answers the same
whatever the cache held. `quant="int4"` does the same with int4
copies (a scale and a zero per 32 inputs, llama.cpp's Q4_1 grid) of all linears but the head,
which stays int8.

Where engine/native.c can be built (an x86-64 CPU with AVX2 and FMA, and a C compiler), those short
forwards run there instead of in torch ops (`native`: norms, products, RoPE, attention, SwiGLU,
residuals; all the layers in one call where the weights allow): the same row-for-row exactness, at a
fraction of the cost (see engine/native.py). quant="int8" is then the faster recipe.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Mapping, Sequence

import torch

from engine import native as native_kernels
from engine.model import prefill_reusing

log = logging.getLogger(__name__)

SUPPORTED = ("llama", "qwen2")
QUANTS = ("none", "int8", "int4")
ALIGN = 64  # bytes: where the int8/int4 kernels' operands must start (see _load_packed)
INT4_GROUP = 32  # weights per (scale, zero) pair: llama.cpp's Q4_0/Q4_1 block
# Forwards of at most this many tokens (decode, verify, a keystroke's few new tokens, and the pieces a
# quantized LeanLM's prefill runs in: LeanLM.prefill_rows) use the int8 weights; longer ones (a long
# `forward`, as benches time it) use the dense weights. int8 weight-only GEMV reads a quarter
# of float32's bytes (a SmolLM2-135M decode step is memory-bound), but its kernel's cost grows with
# the rows, while a dense bf16 GEMM of 256 rows is ~3x faster than int8's.
INT8_MAX_ROWS = 32
QUANT_CACHE_VERSION = 1  # bump when Linear's int8 or int4 recipe changes


_FP32_DENSE: bool | None = None


def dense_in_float32() -> bool:
    """Should a CPU's long bf16 GEMMs (prefill chunks) run in float32 instead? True where oneDNN has no
    bf16 kernels for this CPU (`torch.ops.mkldnn._is_mkldnn_bf16_supported()` False: AVX2 machines,
    e.g. AMD Zen 2/3 and most laptops): there torch falls back to a reference bf16 GEMM. On such a
    2-core AVX2 VM (2026-12-06) a 256-row gate/up projection took 53 ms in bf16 and 7 ms in float32,
    and a 512-token SmolLM2 prefill 6.6 s; CPUs with AVX-512 or AMX keep bf16, which was faster there.
    DRAFTLINE_DENSE_FP32=1/0 overrides the check."""
    global _FP32_DENSE
    if _FP32_DENSE is None:
        forced = os.environ.get("DRAFTLINE_DENSE_FP32", "")
        if forced in ("0", "1"):
            _FP32_DENSE = forced == "1"
        else:
            try:
                _FP32_DENSE = not torch.ops.mkldnn._is_mkldnn_bf16_supported()
            except (AttributeError, RuntimeError):
                _FP32_DENSE = False
        if _FP32_DENSE:
            log.info("this CPU has no fast bf16 GEMM: long (prefill) matmuls run in float32")
    return _FP32_DENSE


def dense_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """x W^T (+ b) for a dense weight; a bf16 GEMM on a CPU without bf16 kernels runs in float32 (the
    weight converted on the fly: ~0.13 ms for a 576x1536 matrix, no second copy kept) and is
    rounded back to bf16, as the bf16 kernel rounds its float32 accumulators. Only for more than
    INT8_MAX_ROWS rows: shorter ones (decode, verify) keep their kernels, so a verify row stays the
    bits of a decode step, and a one-row bf16 GEMV reads half float32's bytes."""
    if x.dtype == torch.bfloat16 and x.device.type == "cpu" and x.shape[0] > INT8_MAX_ROWS and dense_in_float32():
        return torch.nn.functional.linear(x.float(), w.float(), None if b is None else b.float()).to(x.dtype)
    return torch.nn.functional.linear(x, w, b)


class Linear:
    """y = x W^T (+ b) with dense weights, and optionally int8 or int4 weights for short inputs.

    torch's `_weight_int8pack_mm` (per-row scales) and `_weight_int4pack_mm_for_cpu` (a scale and a
    zero per INT4_GROUP inputs), both CPU kernels with bf16 activations, give each row the same
    bits whether it runs alone or with up to INT8_MAX_ROWS others (checked by the tests), so a
    verify forward's rows equal the decode steps of plain greedy and speculation stays lossless.
    A matrix the int4 kernel cannot take (K not a multiple of INT4_GROUP, N not of 16) stays int8.

    With `native` (engine/native.c loaded), the int8 and int4 products run there instead: the input
    is quantized to int8 per block of 32 and multiplied in integers, reading each weight block once
    for up to four rows. int8 keeps its weights in tiles of four rows (`native.q8_tile`: `q` is then
    (N rounded up to 4, K)) and adds a float32 copy of the scales (`sf`); int4
    keeps llama.cpp's Q4_1 blocks (`q` nibbles, `s` float32 scales and minima per 32 inputs, `n4`).
    """

    __slots__ = ("w", "b", "q", "s", "int4", "sf", "n4")

    def __init__(self, w: torch.Tensor, b: torch.Tensor | None = None, quant: str = "none",
                 packed: tuple[torch.Tensor, torch.Tensor] | None = None, native: bool = False):
        self.w, self.b, self.q, self.s, self.sf = w, b, None, None, None
        if quant == "int4" and not int4_fits(w):
            quant = "int8"
        k = w.shape[1]
        if quant == "int8" and not (native and k % native_kernels.QK == 0) and k % 16:
            # neither the native kernels (blocks of 32 inputs) nor torch's int8 kernel can take it: on an
            # AVX-512 CPU `_weight_int8pack_mm` gave NaN for one row and crashed the process for several
            # when K % 16 != 0 (an ffn of 100, a head_dim of 50): the linear stays dense
            quant = "none"
        self.int4 = quant == "int4"
        self.n4 = self.int4 and native
        if packed is not None and packed[0].dtype != (torch.uint8 if self.int4 else torch.int8):
            packed = None  # a cache of the other recipe: recompute
        if packed is not None and self.int4 and (packed[1].dtype == torch.float32) != self.n4:
            packed = None  # torch's int4 layout where the native one is wanted, or the other way round
        if quant in ("int8", "int4") and packed is not None:
            self.q, self.s = packed
        elif self.n4:
            self.q, self.s = native_kernels.q4_pack(w)
        elif quant == "int4":
            self.q, self.s = _int4_pack(w)
        elif quant == "int8":
            scale = w.float().abs().amax(1).clamp_min(1e-12) / 127.0  # (N,)
            self.q = torch.round(w.float() / scale[:, None]).clamp_(-127, 127).to(torch.int8).contiguous()  # (N, K)
            self.s = scale.to(w.dtype)
        if native and quant == "int8" and w.shape[1] % native_kernels.QK == 0:
            self.sf = self.s.float().contiguous()
            if packed is None or self.q.shape[0] != -(-w.shape[0] // native_kernels.Q8_NW) * native_kernels.Q8_NW:
                self.q = native_kernels.q8_tile(self.q)  # the cache (quant_cache_key) keeps the tiles

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """x W^T (+ b) (+ residual: the native kernels add it as they write the result)."""
        added = None
        if self.q is not None and x.shape[0] <= INT8_MAX_ROWS:
            res = residual if self.b is None else None
            if self.sf is not None:
                y, added = native_kernels.q8_linear(x, self.q, self.sf, res), res
            elif self.n4:
                y, added = native_kernels.q4_linear(x, self.q, self.s, res), res
            elif self.int4:
                y = torch._weight_int4pack_mm_for_cpu(x.contiguous(), self.q, INT4_GROUP, self.s)
            else:
                y = torch._weight_int8pack_mm(x, self.q, self.s)
            if self.b is not None:
                y = y + self.b
        else:
            y = dense_linear(x, self.w, self.b)
        return y if residual is None or added is not None else residual + y


def quant_cache_key(quant: str, native: bool) -> str:
    """The name under which `quant`'s copies of the linears are kept (Weights.cache_file): the native
    kernels' layouts (int4 blocks, int8 tiles) and torch's go to separate files."""
    return f"{quant}-native" if native else quant


def int4_fits(w: torch.Tensor) -> bool:
    """Can the CPU int4 kernel take this (N, K) weight? It walks N in blocks of 16/32/48/64 and K in groups."""
    n, k = w.shape
    return k % INT4_GROUP == 0 and n % 16 == 0


def _int4_pack(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Asymmetric int4 per group of INT4_GROUP input weights: (packed uint8, scale/zero (K/G, N, 2))."""
    n, k = w.shape
    g = w.float().reshape(n, k // INT4_GROUP, INT4_GROUP)
    lo, hi = g.amin(-1), g.amax(-1)
    scale = ((hi - lo) / 15).clamp_min(1e-12)
    q = torch.round((g - lo[..., None]) / scale[..., None]).clamp_(0, 15).to(torch.int32).reshape(n, k)
    zero = lo + 8 * scale  # the kernel computes (q - 8) * scale + zero
    sz = torch.stack([scale, zero], -1).transpose(0, 1).contiguous().to(w.dtype)
    return torch._convert_weight_to_int4pack_for_cpu(q.contiguous(), 1), sz


def supports(model: Any) -> str | None:
    """None when the lean path can run this model (a transformers model, or its config) exactly, else why not."""
    cfg = getattr(model, "config", model)
    if cfg.model_type not in SUPPORTED:
        return f"model_type {cfg.model_type}"
    for rope in (getattr(cfg, "rope_scaling", None), getattr(cfg, "rope_parameters", None)):
        rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
        if rope_type not in ROPE_TYPES:
            return f"rope scaling {rope_type}"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"activation {cfg.hidden_act}"
    if getattr(cfg, "use_sliding_window", False):
        return "sliding-window attention"
    if getattr(cfg, "mlp_bias", False):
        return "MLP bias"
    heads, kv = cfg.num_attention_heads, getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    if heads % kv:  # the kernels map query head h to KV head h // (heads // kv): it must divide
        return f"{heads} attention heads over {kv} KV heads"
    return None


class Config(SimpleNamespace):
    """A config.json read as attributes, for a model loaded without transformers."""

    @classmethod
    def read(cls, directory: str | os.PathLike) -> Config:
        return cls(**json.loads((Path(directory) / "config.json").read_text()))


class Weights:
    """A model as the lean decoder reads it: a config and tensors by their Hugging Face names.

    Either a loaded transformers model's, or a directory's safetensors read directly
    (`from_dir`), which a start needs when transformers is not imported at all. `quant_cache`: the
    stem of the files where the int8/int4 copies of the linears are kept between starts (computing
    them took ~1-2 s for SmolLM2-135M on this CPU, reading them back ~0.05 s).
    """

    def __init__(self, config: Any, tensors: Mapping[str, torch.Tensor], quant_cache: Path | None = None):
        self.config, self.tensors, self.quant_cache = config, tensors, quant_cache

    def cache_file(self, quant: str) -> Path | None:
        """Where the `quant` copies of this model's linears are kept (None: not kept)."""
        stem = self.quant_cache
        return None if stem is None else stem.with_name(f"{stem.name}-{quant}.safetensors")

    @classmethod
    def from_model(cls, model: Any) -> Weights:
        return cls(model.config, {name: t.detach() for name, t in model.state_dict().items()})

    @classmethod
    def from_dir(cls, directory: str | os.PathLike, dtype: torch.dtype, device: torch.device) -> Weights:
        """config.json and *.safetensors of an HF directory, cast to `dtype` on `device`."""
        from safetensors.torch import load_file

        directory = Path(directory)
        files = sorted(directory.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"{directory}: no .safetensors weights")
        tensors: dict[str, torch.Tensor] = {}
        for f in files:
            tensors.update((k, v.to(device, dtype)) for k, v in load_file(f).items())
        stamp = "|".join(f"{f.resolve()}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files)
        key = hashlib.sha256(f"{stamp}|{dtype}|v{QUANT_CACHE_VERSION}".encode()).hexdigest()[:24]
        from engine.gguf import cache_root

        return cls(Config.read(directory), tensors, cache_root() / "lean" / key)

    def __getitem__(self, name: str) -> torch.Tensor:
        if name == "lm_head.weight" and name not in self.tensors:  # tied to the embeddings
            name = "model.embed_tokens.weight"
        return self.tensors[name]

    def get(self, name: str) -> torch.Tensor | None:
        return self.tensors.get(name)


def packed_layout(native: bool) -> str:
    """What a quantized-weights cache file's tensors mean, kept in its metadata: a file written for
    another layout is recomputed, not read. The native int8 weights went from plain rows to tiles of
    four rows on 2026-12-07, and an int4 file's int8 head, written before, was then read as tiles:
    the int4 arm's logits were garbage on every machine that had run it before (bench quant: top-1
    0 %). Change the native part whenever a product's weight layout changes."""
    return f"native:q8-tiles-{native_kernels.Q8_NW};q4_1-blocks" if native else "torch"


def _load_packed(path: Path | None, layout: str) -> dict[str, torch.Tensor]:
    if path is None or not path.is_file():
        return {}
    from safetensors import safe_open
    from safetensors.torch import load_file

    try:
        with safe_open(path, framework="pt") as f:
            found = (f.metadata() or {}).get("layout")
        if found != layout:  # an older layout (or a file from before layouts were recorded)
            log.info("quantized-weights cache %s has layout %r, not %r: recomputing it", path, found, layout)
            return {}
        tensors = load_file(path)
    except Exception as exc:  # a damaged cache costs one recomputation, never a start
        log.warning("ignoring the quantized-weights cache %s: %s", path, exc)
        return {}
    # safetensors places data right after its header, so these tensors start 8 bytes off a 16-byte
    # boundary, and torch's int8/int4 CPU kernels use aligned vector loads: SmolLM2's head, read so,
    # died with SIGSEGV on a `vmovdqa` (2026-12-05). Copies are 64-byte aligned (torch's allocator).
    return {k: v if v.data_ptr() % ALIGN == 0 else v.clone() for k, v in tensors.items()}


def _save_packed(path: Path, linears: Mapping[str, "Linear"], layout: str) -> None:
    from safetensors.torch import save_file

    tensors = {}
    for name, lin in linears.items():
        tensors[f"{name}.q"], tensors[f"{name}.s"] = lin.q, lin.s
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        save_file(tensors, tmp, metadata={"layout": layout})
        tmp.replace(path)
    except OSError as exc:  # a read-only cache costs the quantization next start
        log.warning("could not keep the quantized weights in %s: %s", path, exc)


# RoPE variants the decoder computes (transformers' rope_type names): these change the frequencies only,
# not the attention's scale (yarn, longrope and dynamic do: they run on transformers)
ROPE_TYPES = (None, "default", "linear", "llama3")


def _rope_scaling(cfg) -> dict:
    """The config's RoPE scaling entries (rope_parameters in transformers 5, rope_scaling before)."""
    for rope in (getattr(cfg, "rope_parameters", None), getattr(cfg, "rope_scaling", None)):
        if isinstance(rope, dict) and rope.get("rope_type", rope.get("type")) not in (None, "default"):
            return rope
    return {}


def inv_freq(cfg, head_dim: int) -> torch.Tensor:
    """RoPE's inverse frequencies (head_dim / 2,), float32, with linear or Llama 3 scaling applied as
    transformers' `_compute_linear_scaling_rope_parameters` / `_compute_llama3_parameters` do."""
    inv = 1.0 / (_rope_theta(cfg) ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    rope = _rope_scaling(cfg)
    kind = rope.get("rope_type", rope.get("type"))
    if kind == "linear":
        inv = inv / float(rope["factor"])
    elif kind == "llama3":
        factor, low, high = float(rope["factor"]), float(rope["low_freq_factor"]), float(rope["high_freq_factor"])
        old = float(rope["original_max_position_embeddings"])
        wavelen = 2 * torch.pi / inv
        scaled = torch.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / high) * ~(wavelen > old / low)
        inv = torch.where(medium, smoothed, scaled)
    return inv


def _rope_theta(cfg) -> float:
    theta = getattr(cfg, "rope_theta", None)
    params = getattr(cfg, "rope_parameters", None)
    if theta is None and isinstance(params, dict):
        theta = params.get("rope_theta")
    return float(theta or 10000.0)


class LeanLM:
    """Drop-in for CachedLM: tokens, forward(new, keep_logits), truncate(n), prefill(tokens), reset().

    Beyond CachedLM: token trees, forward_tree(tokens, parents) then keep_path(nodes).
    """

    supports_tree = True  # engine.tree.tree_support(lm) reads this; CachedLM has no trees
    # native short forwards: all layers in one call (native_kernels.Layers) where the weights allow;
    # False: one call per step (the same bits, tests compare them)
    fuse_layers = True

    def __init__(self, model: Any, device: torch.device, vocab_limit: int | None = None, max_len: int = 4096,
                 chunk: int | None = None, quant: str = "none", graphs: bool = False, native: bool | None = None):
        """`model`: a transformers model, or `Weights` (a directory read without transformers).

        `native`: run the short forwards (decode, verify, trees) on engine/native.c's kernels
        (default: on the CPU wherever they can be built; False keeps torch's ops).

        `graphs`: forwards of up to engine.graphs.MAX_ROWS tokens (decode, verify, trees) run as CUDA
        graphs on a GPU (engine/graphs.py; eagerly elsewhere, through the same code)."""
        source = model if isinstance(model, Weights) else Weights.from_model(model)
        cfg = source.config
        why = supports(cfg)
        if why:
            raise ValueError(f"lean decoder cannot run this model: {why}")
        dtype = source["model.embed_tokens.weight"].dtype
        if quant not in QUANTS:
            raise ValueError(f"quant must be one of {', '.join(QUANTS)}, not {quant!r}")
        if quant != "none" and (torch.device(device).type != "cpu" or dtype != torch.bfloat16):
            raise ValueError(f"quant={quant!r} runs on the CPU with bfloat16 activations (dtype='bfloat16')")
        self.quant = quant
        self.device, self.vocab_limit, self.max_len = device, vocab_limit, max_len
        self.capacity = max_len
        # Long prefills run in chunks: on this CPU one 3.5k-token forward took 3.3x as long as the
        # same tokens in 256-token chunks (the attention of one big block is memory-bound);
        # `draftline bench scenarios` prints both (costs.prefill_ms). Unmeasured on GPUs: unchunked there.
        self.chunk = chunk if chunk is not None else (256 if torch.device(device).type == "cpu" else 0)
        # On CPU, attention as two matmuls and a softmax beats scaled_dot_product_attention for
        # these shapes: 48 vs 121 us for one query over 1,500 positions, 6.1 vs 7.5 ms for a
        # 256-token chunk (4 heads of 64). GPUs keep SDPA (flash kernels).
        self.manual_attention = torch.device(device).type == "cpu"
        # the kernels take float32 and bfloat16 activations (a float16 model on the CPU runs torch's ops)
        native_dtype = dtype in (torch.float32, torch.bfloat16)
        if native is None:
            native = self.manual_attention and native_dtype and native_kernels.lib() is not None
        elif native and not (self.manual_attention and native_dtype and native_kernels.lib() is not None):
            why = native_kernels.unavailable_reason() or ("not on a CPU" if not self.manual_attention else f"{dtype}")
            raise ValueError(f"native kernels unavailable: {why}")
        self.native = native
        self.native_prefill_attention = True  # prefill chunks attend on the native kernel too (see _forward)
        # With quantized weights, `prefill` (the engine's prompts) runs in forwards of at most this many
        # tokens: every prompt position is then computed by the decode step's kernels (int8/int4 rows, one
        # query at a time), whatever the cache held before, so a warm prompt's few new tokens give the bits
        # a cold prefill gives them, and reused positions (an earlier answer's tokens too) are what a cold
        # prompt computes. With longer forwards on the dense weights, a cold prompt's last token came from
        # a dense chunk and a warm one's from a 1-row int8 forward: other KV and logits (up to 1.1 apart on
        # SmolLM2), and a repeated request answered differently in 25 of 87 probes (0 now). The cost, on a
        # 2-core AVX2 VM (float32 dense GEMMs, 2026-12-07): none, a cold 200 / 510-token prompt took 469 /
        # 1,216 ms against 557 / 1,464 ms in dense chunks; held-out NLL 1.998 against 1.993 (24 windows of
        # 512 tokens), `bench model --tasks 200` exact 18 / 10 % against 21 / 10 %, first word 53 / 46 %
        # against 54 / 43 %. Unmeasured where bf16 GEMMs are fast (AVX-512 bf16, AMX), where a dense chunk
        # is cheaper and these pieces may cost a cold prompt more. 0: prefill in chunks on the dense weights
        # (`forward` of a long sequence still does that: benches time it).
        self.prefill_rows = INT8_MAX_ROWS if quant != "none" else 0
        self.tokens: list[int] = []
        self.forwards = 0
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.scale = 1.0 / float(self.head_dim) ** 0.5
        self.eps = cfg.rms_norm_eps
        cache = source.cache_file(quant_cache_key(quant, native)) if quant != "none" else None
        packed = _load_packed(cache, packed_layout(native))
        linears: dict[str, Linear] = {}

        def linear(name: str, w: torch.Tensor, b: torch.Tensor | None = None) -> Linear:
            pair = (packed[f"{name}.q"], packed[f"{name}.s"]) if f"{name}.q" in packed else None
            # the head stays int8 under int4: an int4 head decoded SmolLM2 1.1 ms/token faster (10.6 vs
            # 11.7) but held-out completions fell from 24 to 20 % exact, edit similarity 0.64 to 0.60
            head8 = quant == "int4" and name == "lm_head"
            linears[name] = Linear(w, b, "int8" if head8 else quant, pair, native)
            return linears[name]

        self.embed = source["model.embed_tokens.weight"]
        self.rows = int(self.embed.shape[0])
        self.final_norm = source["model.norm.weight"]
        self.lm_head = linear("lm_head", source["lm_head.weight"])
        self.layers = []
        for i in range(cfg.num_hidden_layers):
            pre = f"model.layers.{i}."
            a, m = pre + "self_attn.", pre + "mlp."
            wqkv = torch.cat([source[a + "q_proj.weight"], source[a + "k_proj.weight"], source[a + "v_proj.weight"]])
            bias = None
            if source.get(a + "q_proj.bias") is not None:
                bias = torch.cat([source[a + "q_proj.bias"], source[a + "k_proj.bias"], source[a + "v_proj.bias"]])
            self.layers.append((
                source[pre + "input_layernorm.weight"], linear(f"{i}.qkv", wqkv, bias),
                linear(f"{i}.o", source[a + "o_proj.weight"]),
                source[pre + "post_attention_layernorm.weight"],
                linear(f"{i}.gate_up", torch.cat([source[m + "gate_proj.weight"], source[m + "up_proj.weight"]])),
                linear(f"{i}.down", source[m + "down_proj.weight"]),
            ))
        if cache is not None and not packed:
            _save_packed(cache, linears, packed_layout(native))
        self.ffn = source["model.layers.0.mlp.gate_proj.weight"].shape[0]
        inv = inv_freq(cfg, self.head_dim)
        angles = torch.outer(torch.arange(max_len, dtype=torch.float32), inv)  # (L, D/2)
        emb = torch.cat([angles, angles], -1)
        # sin with its first half negated: rotate-half(x) * sin is then roll(x, D/2) * sin, one op fewer
        # than splitting and concatenating, with the same bits
        sin = emb.sin()
        sin[:, : self.head_dim // 2].neg_()
        self.cos, self.sin = emb.cos().to(device, dtype), sin.to(device, dtype)  # (L, D)
        shape = (len(self.layers), 2, self.n_kv, max_len, self.head_dim)
        # On CPU attention runs in float32 (a one-query bf16 q @ K^T over 1,000 keys took 104 us here,
        # float32 37 us), so the cache holds float32 there.
        kv_dtype = torch.float32 if self.manual_attention else dtype
        self.set_cache(torch.zeros(shape, dtype=kv_dtype, device=device))
        # the native attention's scratch: scores and the query, a row per (token, head) of a short forward
        self._work = torch.empty((INT8_MAX_ROWS * self.n_heads, max_len + self.head_dim),
                                 dtype=torch.float32) if native else None
        self.model = model
        self.hidden: torch.Tensor | None = None  # see keep_hidden
        self.graphs = None
        if graphs:
            from engine.graphs import Graphs

            self.graphs = Graphs(self)

    def keep_hidden(self) -> torch.Tensor:
        """From now on, every forward also writes its last layer's output (before the final norm) per
        position into `self.hidden` (max_len, hidden): what an EAGLE draft (engine.eagle) reads.
        Positions below len(self.tokens) are valid; a truncate leaves the rest to be overwritten."""
        if self.hidden is None:
            self.hidden = torch.zeros((self.max_len, self.embed.shape[1]), dtype=self.embed.dtype, device=self.device)
        return self.hidden

    def set_cache(self, kv: torch.Tensor) -> None:
        """Use `kv` (layers, k|v, KVH, L, D) as the KV cache, with its per-layer views made once."""
        self.kv = kv
        self._kv_views = [(kv[i, 0], kv[i, 1]) for i in range(kv.shape[0])]  # (KVH, L, D) each
        self._fused = None  # native_kernels.Layers over these caches, made at the first short forward
        if getattr(self, "graphs", None) is not None:
            self.graphs.reset()  # they write to the old cache's addresses

    def reset(self) -> None:
        self.tokens = []

    def snapshot(self, n: int | None = None) -> tuple[list[int], torch.Tensor, torch.Tensor | None]:
        """A copy of the first n held positions (all by default): their tokens, K/V and, where kept,
        hidden rows (engine.slots keeps a few, to put back with `restore`)."""
        n = len(self.tokens) if n is None else min(n, len(self.tokens))
        return (list(self.tokens[:n]), self.kv[:, :, :, :n].clone(),
                None if self.hidden is None else self.hidden[:n].clone())

    def restore(self, snap: tuple[list[int], torch.Tensor, torch.Tensor | None]) -> None:
        """Hold a snapshot's positions again, in place (the cache's addresses do not change: a
        native Layers table and CUDA graphs keep pointing at it)."""
        tokens, kv, hidden = snap
        n = len(tokens)
        self.kv[:, :, :, :n].copy_(kv)
        if hidden is not None and self.hidden is not None:
            self.hidden[:n].copy_(hidden)
        self.tokens = list(tokens)

    def truncate(self, n: int) -> None:
        del self.tokens[n:]  # positions >= n are simply overwritten later

    def prefill(self, tokens: Sequence[int], cancel: threading.Event | None = None) -> tuple[torch.Tensor | None, int]:
        return prefill_reusing(self, tokens, cancel, rows=self.prefill_rows or None)

    @staticmethod
    def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """RoPE: x * cos + rotate_half(x) * sin, with `sin` as self.sin holds it (first half negated)."""
        return x * cos + x.roll(self.head_dim // 2, -1) * sin

    @torch.inference_mode()
    def forward(self, new_tokens: Sequence[int], keep_logits: int | None = None, rows: int | None = None) -> torch.Tensor:
        """Append tokens; return float32 logits (T', V) of the last `keep_logits` (all by default).
        `rows`: run them in forwards of at most that many tokens (else in `chunk`s)."""
        t = len(new_tokens)
        if t == 0:
            raise ValueError("forward needs at least one token")
        if len(self.tokens) + t > self.max_len:
            raise ValueError(f"sequence of {len(self.tokens) + t} tokens exceeds the lean cache ({self.max_len})")
        self.forwards += 1  # one call, however many chunks
        keep = min(keep_logits, t) if keep_logits else t  # 0 or None: all, as before
        step = min(rows, self.chunk or rows) if rows else self.chunk
        if not step or t <= step:
            return self._forward(new_tokens, keep)
        pieces = []
        for s in range(0, t, step):
            piece = new_tokens[s : s + step]
            want = max(0, keep - (t - s - len(piece)))  # logits wanted from this chunk's tail
            out = self._forward(piece, min(want, len(piece)))
            if want:
                pieces.append(out)
        return torch.cat(pieces) if len(pieces) > 1 else pieces[0]

    def _inputs(self, ids: torch.Tensor, start: int, end: int) -> torch.Tensor:
        """The first layer's input for the tokens `ids` at positions start..end-1: their embeddings."""
        return self.embed[ids]

    def _attend_one(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """One token's attention over keys/values (KVH, L, D): q (H, D) -> (H, D)."""
        kvh, d = keys.shape[0], self.head_dim
        scores = torch.matmul(q.reshape(kvh, -1, d).contiguous(), keys.transpose(1, 2)).mul_(self.scale)  # (KVH, G, L)
        return torch.matmul(torch.softmax(scores, -1), values).reshape(-1, d)

    def _native_layers(self, x: torch.Tensor, start: int) -> torch.Tensor:
        """The layers of a short forward (decode, verify) on the native kernels: RMSNorm, RoPE and the
        cache writes, attention one query at a time, SwiGLU's product and the residual additions are
        each one call, where the torch version takes ~35 small ops a layer. Each row's result is its
        decode step's, bit for bit."""
        nk, t = native_kernels, x.shape[0]
        cos, sin = self.cos[start : start + t], self.sin[start : start + t]
        if self.fuse_layers:
            if self._fused is None or (self._fused and self._fused.dtype != x.dtype):
                self._fused = nk.Layers(self.layers, self._kv_views, self.n_heads, self.n_kv, self.head_dim, self.ffn,
                                        self.eps, self.scale, INT8_MAX_ROWS, x.dtype, self._work) \
                    if nk.Layers.fits(self.layers, x.dtype) else False
            if self._fused:
                return self._fused(x, start, cos, sin)
        q = torch.empty((self.n_heads, t, self.head_dim), dtype=torch.float32)
        for li, (ln1, wqkv, wo, ln2, wgu, wdown) in enumerate(self.layers):
            cache_k, cache_v = self._kv_views[li]
            nk.rope_store(wqkv(nk.rmsnorm(x, ln1, self.eps)), cos, sin, self.n_heads, self.n_kv, q, cache_k, cache_v, start)
            x = wo(nk.attend(q, cache_k, cache_v, start, self.scale, self._work, out_dtype=x.dtype), residual=x)
            x = wdown(nk.silu_mul(wgu(nk.rmsnorm(x, ln2, self.eps))), residual=x)
        return x

    def _final_norm(self, x: torch.Tensor, short: bool) -> torch.Tensor:
        """The final RMSNorm: the native kernel's in a short forward on them, as in its layers."""
        if short and self.native:
            return native_kernels.rmsnorm(x, self.final_norm, self.eps)
        return self._rms(x, self.final_norm, self.eps)

    def _forward(self, new_tokens: Sequence[int], keep: int) -> torch.Tensor | None:
        """One forward of all of `new_tokens`; logits of the last `keep` (None when keep is 0)."""
        start, t = len(self.tokens), len(new_tokens)
        end = start + t
        if self.graphs is not None and t <= self.graphs.max_rows:
            logits = self.graphs.run(new_tokens, start)
            self.tokens.extend(int(tok) for tok in new_tokens)
            return self._limit(logits[-keep:]) if keep else None
        ids = torch.tensor(list(new_tokens), dtype=torch.long, device=self.device)
        x = self._inputs(ids, start, end)  # (T, C)
        cos, sin = self.cos[start:end], self.sin[start:end]  # (T, D)
        h, kvh, d = self.n_heads, self.n_kv, self.head_dim
        group = h // kvh
        mask = None
        # decode and verify (the int8 rows) attend one query token at a time, exactly as a decode step
        # does: one matmul over the rows of all T tokens and a longer masked key range gave other bits
        # from T = 4 on (SmolLM2, bf16), and greedy speculation then drifted from plain decoding
        per_token = self.manual_attention and t <= INT8_MAX_ROWS
        # a longer forward (a prefill chunk) on the native kernels attends with the decode step's kernel
        # too, INT8_MAX_ROWS rows a call: each row sees exactly its causal keys (no masked scores); whole
        # prefills took 0.85-0.95x the time of the float32 matmuls and softmax below (`bench quant`)
        native_att = self.native and self.native_prefill_attention and not per_token
        if t > 1 and not per_token and not native_att and (start > 0 or self.manual_attention):  # new token i sees the cache and new tokens 0..i
            mask = torch.ones(t, end, dtype=torch.bool, device=self.device).tril(diagonal=start)  # (T, L)
        if mask is not None and self.manual_attention:
            bias = torch.zeros(t, end, dtype=self.kv.dtype, device=self.device).masked_fill_(~mask, float("-inf"))
            bias = bias.repeat(group, 1)  # rows: the heads sharing a KV head, each with its T queries
        elif mask is not None:
            mask = mask.repeat(group, 1)  # the same rows for SDPA
        layers = self.layers
        if per_token and self.native:
            x, layers = self._native_layers(x, start), ()
        # decode runs ~60 small ops a layer, each a few microseconds of dispatch on the CPU (about as
        # long as the layer's int4 matmuls): q and k rotate together, the cache views are made once
        for li, (ln1, wqkv, wo, ln2, wgu, wdown) in enumerate(layers):
            qkv = wqkv(self._rms(x, ln1, self.eps))  # (T, (H + 2 KVH) D)
            qk = self._rotate(qkv[:, : (h + kvh) * d].view(t, h + kvh, d).transpose(0, 1), cos, sin)  # (H + KVH, T, D)
            q, k = qk[:h], qk[h:]
            cache_k, cache_v = self._kv_views[li]
            cache_k[:, start:end] = k
            cache_v[:, start:end] = qkv[:, (h + kvh) * d :].view(t, kvh, d).transpose(0, 1)
            keys, values = cache_k[:, :end], cache_v[:, :end]  # (KVH, L, D)
            if native_att:
                att = torch.cat([native_kernels.attend(q[:, i : i + INT8_MAX_ROWS], cache_k, cache_v, start + i,
                                                       self.scale, self._work, out_dtype=x.dtype)
                                 for i in range(0, t, INT8_MAX_ROWS)])  # (T, C)
            elif per_token and t == 1:
                att = self._attend_one(q.float(), keys, values).to(x.dtype)  # (H, D)
            elif per_token:
                qf = q.float()
                att = torch.stack([self._attend_one(qf[:, i], keys[:, : start + i + 1], values[:, : start + i + 1])
                                   for i in range(t)], 1).to(x.dtype)  # (H, T, D)
            elif self.manual_attention:  # the heads sharing a KV head become rows of one query: (KVH, G*T, D)
                scores = torch.matmul(q.float().reshape(kvh, group * t, d), keys.transpose(1, 2)).mul_(self.scale)
                if mask is not None:
                    scores.add_(bias)
                att = torch.matmul(torch.softmax(scores, -1), values).to(x.dtype)  # (KVH, G*T, D) = (H, T, D) in head order
            # SDPA (GPUs) takes 4-D inputs: on 3-D ones CUDA's fused kernels refuse and the unfused math
            # kernel runs. The heads sharing a KV head become rows of one query (no copy of K/V per head)
            elif t == 1:  # decode: (1, KVH, G, D)
                att = torch.nn.functional.scaled_dot_product_attention(
                    q.reshape(1, kvh, group, d), keys[None], values[None])[0]  # (KVH, G, D)
            elif mask is None:  # a prefill from position 0: causal, and the flash kernels take GQA as it is
                att = torch.nn.functional.scaled_dot_product_attention(
                    q[None], keys[None], values[None], is_causal=True, enable_gqa=group > 1)[0]  # (H, T, D)
            else:  # after the cache: each row's allowed keys; the mask repeats for the G heads' rows
                att = torch.nn.functional.scaled_dot_product_attention(
                    q.reshape(1, kvh, group * t, d), keys[None], values[None],
                    attn_mask=mask)[0]  # (KVH, G*T, D) = (H, T, D) in head order
            if not native_att:
                att = att.reshape(h, t, d).transpose(0, 1).reshape(t, h * d)  # (T, C)
            x = x + wo(att)
            gate, up = wgu(self._rms(x, ln2, self.eps)).split(self.ffn, -1)
            x = x + wdown(torch.nn.functional.silu(gate) * up)
        self.tokens.extend(int(tok) for tok in new_tokens)
        if self.hidden is not None:
            self.hidden[start:end] = x
        if keep == 0:
            return None
        x = x[-keep:]
        return self._limit(self.lm_head(self._final_norm(x, per_token)).float())

    def _limit(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits over the vocabulary shared with another model (all of them without a limit)."""
        return logits if self.vocab_limit is None else logits[:, : self.vocab_limit]

    @torch.inference_mode()
    def forward_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        """Run a token tree after the cache in one forward; float32 logits (N, V), one row per node.

        Node i holds tokens[i] and hangs from node parents[i] (an earlier node), or from the last
        cached token when parents[i] is -1 (the speculative loop's pending token is node 0, the only
        root, and the drafts hang from it). Node i sits at position len(self.tokens) + depth(i) and
        attends to the whole cache, its ancestors and itself only. The cache and `tokens` are left
        as they were; keep_path(nodes) then makes one root-to-node path part of the sequence.

        Where a verify forward attends one query token at a time (CPU, at most INT8_MAX_ROWS
        nodes), node i attends over exactly the keys a decode step would see: its path's K/V are
        written, in path order, right after the cache (the nodes are visited depth first, so each
        writes one row) and it attends over cache[:start + depth + 1]. Its row is then the decode
        step's computation, bit for bit. Larger trees, and GPUs, use one forward with a tree mask.
        """
        n = len(tokens)
        if n == 0 or len(parents) != n:
            raise ValueError("forward_tree needs one parent per token, and at least one token")
        depth, anc_rows = tree_inputs(parents)
        start = len(self.tokens)
        per_token = self.manual_attention and n <= INT8_MAX_ROWS
        room = start + (max(depth) + 1 if per_token else n)
        if room > self.max_len:
            raise ValueError(f"a tree needing {room} positions exceeds the lean cache ({self.max_len})")
        self.forwards += 1
        if self.graphs is not None and n <= self.graphs.max_rows:
            # node i's K/V land at slot start + i, as the masked path below writes them; keep_path reads copies
            logits = self.graphs.run(tokens, start, parents)
            tree_kv = self.kv[:, :, :, start : start + n].clone()
            hidden = None if self.hidden is None else self.hidden[start : start + n].clone()
            self._tree = (start, self.forwards, [int(t) for t in tokens], list(parents), tree_kv, hidden)
            return self._limit(logits)
        ids = torch.tensor(list(tokens), dtype=torch.long, device=self.device)
        pos = torch.tensor([start + dd for dd in depth], dtype=torch.long, device=self.device)
        x = self.embed[ids]  # (N, C)
        cos, sin = self.cos[pos], self.sin[pos]  # (N, D): RoPE by depth
        h, kvh, d = self.n_heads, self.n_kv, self.head_dim
        group = h // kvh
        tree_kv = torch.empty((len(self.layers), 2, kvh, n, d), dtype=self.kv.dtype, device=self.device)
        if per_token:
            order = _depth_first(parents)
        else:
            anc = torch.tensor(anc_rows, dtype=torch.bool)  # ancestor-or-self rows
            mask = torch.cat([torch.ones(n, start, dtype=torch.bool), anc], 1).to(self.device)  # (N, start + N)
            if self.manual_attention:
                bias = torch.zeros(n, start + n, dtype=self.kv.dtype, device=self.device).masked_fill_(~mask, float("-inf"))
                bias = bias.repeat(group, 1)
            else:
                mask = mask.repeat(group, 1)  # SDPA's rows: the heads sharing a KV head, each with its N queries
        layers = self.layers
        if per_token and self.native:
            x, layers = self._native_tree_layers(x, cos.contiguous(), sin.contiguous(), tree_kv, start, depth, order), ()
        for li, (ln1, wqkv, wo, ln2, wgu, wdown) in enumerate(layers):
            qkv = wqkv(self._rms(x, ln1, self.eps))  # (N, (H + 2 KVH) D)
            q, k, v = qkv.split([h * d, kvh * d, kvh * d], -1)
            q = self._rotate(q.view(n, h, d).transpose(0, 1), cos, sin)  # (H, N, D)
            tree_kv[li, 0] = self._rotate(k.view(n, kvh, d).transpose(0, 1), cos, sin)
            tree_kv[li, 1] = v.view(n, kvh, d).transpose(0, 1)
            cache = self.kv[li]
            if per_token:
                qf = q.float()
                outs: list[torch.Tensor | None] = [None] * n
                for i in order:  # depth first: positions start..start+depth(i)-1 hold i's ancestors
                    at = start + depth[i]
                    cache[:, :, at] = tree_kv[li, :, :, i]
                    outs[i] = self._attend_one(qf[:, i], cache[0, :, : at + 1], cache[1, :, : at + 1])
                att = torch.stack(outs, 1).to(x.dtype)  # (H, N, D)
            else:
                cache[:, :, start : start + n] = tree_kv[li]
                keys, values = cache[0, :, : start + n], cache[1, :, : start + n]
                if self.manual_attention:
                    scores = torch.matmul(q.float().reshape(kvh, group * n, d), keys.transpose(1, 2)).mul_(self.scale)
                    att = torch.matmul(torch.softmax(scores.add_(bias), -1), values).to(x.dtype)
                else:  # 4-D, the G heads' rows under one KV head (see _forward)
                    att = torch.nn.functional.scaled_dot_product_attention(
                        q.reshape(1, kvh, group * n, d), keys[None], values[None], attn_mask=mask)[0]
            att = att.reshape(h, n, d).transpose(0, 1).reshape(n, h * d)
            x = x + wo(att)
            gate, up = wgu(self._rms(x, ln2, self.eps)).split(self.ffn, -1)
            x = x + wdown(torch.nn.functional.silu(gate) * up)
        self._tree = (start, self.forwards, [int(t) for t in tokens], list(parents), tree_kv, x)
        return self._limit(self.lm_head(self._final_norm(x, per_token)).float())

    def _native_tree_layers(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, tree_kv: torch.Tensor,
                            start: int, depth: Sequence[int], order: Sequence[int]) -> torch.Tensor:
        """forward_tree's layers on the native kernels, node by node as _native_layers runs a decode
        step: node i's K/V go to tree_kv, then, depth first, to the cache right after its ancestors',
        and it attends over cache[:start + depth(i) + 1]. cos/sin: (N, D) rows at the nodes' depths."""
        nk, n = native_kernels, x.shape[0]
        h, d = self.n_heads, self.head_dim
        q = torch.empty((h, n, d), dtype=torch.float32)
        att = torch.empty((n, h * d), dtype=x.dtype)
        for li, (ln1, wqkv, wo, ln2, wgu, wdown) in enumerate(self.layers):
            cache = self.kv[li]
            nk.rope_store(wqkv(nk.rmsnorm(x, ln1, self.eps)), cos, sin, h, self.n_kv, q, tree_kv[li, 0], tree_kv[li, 1], 0)
            for i in order:  # depth first: positions start..start+depth(i)-1 hold i's ancestors
                at = start + depth[i]
                cache[:, :, at] = tree_kv[li, :, :, i]
                att[i] = nk.attend(q[:, i : i + 1], cache[0], cache[1], at, self.scale, self._work, out_dtype=x.dtype)[0]
            x = wo(att, residual=x)
            x = wdown(nk.silu_mul(wgu(nk.rmsnorm(x, ln2, self.eps))), residual=x)
        return x

    def keep_path(self, nodes: Sequence[int]) -> None:
        """After forward_tree: append the path `nodes` (a root, its child, ...) to the sequence.

        Their K/V move to consecutive positions after the cache, exactly what running their tokens
        one by one would have written; every other node is dropped.
        """
        tree = getattr(self, "_tree", None)
        self._tree = None
        if tree is None:
            raise ValueError("keep_path needs a forward_tree first")
        start, forwards, tokens, parents, tree_kv, hidden = tree
        if forwards != self.forwards or len(self.tokens) != start:
            raise ValueError("the cache changed since forward_tree")
        nodes = [int(i) for i in nodes]
        for j, i in enumerate(nodes):
            if not 0 <= i < len(tokens) or parents[i] != (nodes[j - 1] if j else -1):
                raise ValueError(f"nodes {nodes} are not a path from a root of the tree")
        if nodes:
            idx = torch.tensor(nodes, dtype=torch.long, device=self.device)
            self.kv[:, :, :, start : start + len(nodes)] = tree_kv.index_select(3, idx)
            if self.hidden is not None:
                self.hidden[start : start + len(nodes)] = hidden.index_select(0, idx)
        self.tokens.extend(tokens[i] for i in nodes)


def tree_inputs(parents: Sequence[int]) -> tuple[list[int], list[list[bool]]]:
    """Each node's depth and its ancestor-or-self row, for a token tree (parents[i] < i, -1 for a root)."""
    depth: list[int] = []
    anc: list[list[bool]] = []
    n = len(parents)
    for i, p in enumerate(parents):
        if p != -1 and not 0 <= p < i:
            raise ValueError(f"parents[{i}] = {p}: a parent is -1 (the cache's last token) or an earlier node")
        depth.append(depth[p] + 1 if p >= 0 else 0)
        row = list(anc[p]) if p >= 0 else [False] * n
        row[i] = True
        anc.append(row)
    return depth, anc


def _depth_first(parents: Sequence[int]) -> list[int]:
    """The nodes of a tree (parents[i] < i, -1 for a root) in depth-first preorder."""
    children: list[list[int]] = [[] for _ in parents]
    roots = []
    for i, p in enumerate(parents):
        (children[p] if p >= 0 else roots).append(i)
    order, stack = [], roots[::-1]
    while stack:
        i = stack.pop()
        order.append(i)
        stack.extend(children[i][::-1])
    return order
