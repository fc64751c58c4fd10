"""A lean Llama/Qwen2 decoder with a static KV cache: the same seam as CachedLM, less overhead.

Weights come from the loaded transformers model (same HF directory). Q/K/V and gate/up are fused
into single matrices, RoPE tables are precomputed, and the KV cache is one preallocated tensor per
layer indexed by position, so rejection and cross-keystroke reuse are a length change. On this
CPU a transformers forward costs ~0.55 ms of fixed overhead (reference/bakeoff.md §4); for the
small models draftline runs here that overhead is most of a step.

On the CPU, `quant="int8"` (bf16 models) keeps int8 per-row copies of the linears for forwards of up
to INT8_MAX_ROWS tokens (decode, verify), and those forwards attend one query token at a time in
float32: every row of a verify forward is then the very computation of a decode step, bit for bit,
which keeps greedy speculation identical to plain decoding.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Sequence

import torch

from engine.model import prefill_reusing

log = logging.getLogger(__name__)

SUPPORTED = ("llama", "qwen2")
QUANTS = ("none", "int8")
# Forwards of at most this many tokens (decode, verify, a keystroke's few new tokens) use the int8
# weights; longer ones (prefill chunks) use the dense weights. int8 weight-only GEMV reads a quarter
# of float32's bytes (a SmolLM2-135M decode step is memory-bound), but its kernel's cost grows with
# the rows, while a dense bf16 GEMM of 256 rows is ~3x faster than int8's.
INT8_MAX_ROWS = 32


class Linear:
    """y = x W^T (+ b) with dense weights, and optionally int8 per-row weights for short inputs.

    torch's `_weight_int8pack_mm` (CPU, bf16 activations) gives each row the same bits whether it
    runs alone or with up to INT8_MAX_ROWS others (checked by the tests), so a verify forward's
    rows equal the decode steps of plain greedy and speculation stays lossless.
    """

    __slots__ = ("w", "b", "q", "s")

    def __init__(self, w: torch.Tensor, b: torch.Tensor | None = None, quant: str = "none"):
        self.w, self.b, self.q, self.s = w, b, None, None
        if quant == "int8":
            scale = w.float().abs().amax(1).clamp_min(1e-12) / 127.0  # (N,)
            self.q = torch.round(w.float() / scale[:, None]).clamp_(-127, 127).to(torch.int8).contiguous()  # (N, K)
            self.s = scale.to(w.dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.q is not None and x.shape[0] <= INT8_MAX_ROWS:
            y = torch._weight_int8pack_mm(x, self.q, self.s)
            return y + self.b if self.b is not None else y
        return torch.nn.functional.linear(x, self.w, self.b)


def supports(model: Any) -> str | None:
    """None when the lean path can run this model exactly, else the reason it cannot."""
    cfg = model.config
    if cfg.model_type not in SUPPORTED:
        return f"model_type {cfg.model_type}"
    rope = getattr(cfg, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    if rope_type not in (None, "default"):
        return f"rope scaling {rope_type}"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"activation {cfg.hidden_act}"
    if getattr(cfg, "use_sliding_window", False):
        return "sliding-window attention"
    if getattr(cfg, "mlp_bias", False):
        return "MLP bias"
    return None


def _rope_theta(cfg) -> float:
    theta = getattr(cfg, "rope_theta", None)
    params = getattr(cfg, "rope_parameters", None)
    if theta is None and isinstance(params, dict):
        theta = params.get("rope_theta")
    return float(theta or 10000.0)


class LeanLM:
    """Drop-in for CachedLM: tokens, forward(new, keep_logits), truncate(n), prefill(tokens), reset()."""

    def __init__(self, model: Any, device: torch.device, vocab_limit: int | None = None, max_len: int = 4096,
                 chunk: int | None = None, quant: str = "none"):
        why = supports(model)
        if why:
            raise ValueError(f"lean decoder cannot run this model: {why}")
        dtype = next(model.parameters()).dtype
        if quant not in QUANTS:
            raise ValueError(f"quant must be one of {', '.join(QUANTS)}, not {quant!r}")
        if quant == "int8" and (torch.device(device).type != "cpu" or dtype != torch.bfloat16):
            raise ValueError("quant='int8' runs on the CPU with bfloat16 activations (dtype='bfloat16')")
        self.quant = quant
        cfg = model.config
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
        self.tokens: list[int] = []
        self.forwards = 0
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.scale = 1.0 / float(self.head_dim) ** 0.5
        self.eps = cfg.rms_norm_eps
        base = model.model
        self.embed = base.embed_tokens.weight.detach()
        self.final_norm = base.norm.weight.detach()
        self.lm_head = Linear(model.lm_head.weight.detach(), quant=quant)
        self.layers = []
        for layer in base.layers:
            a, m = layer.self_attn, layer.mlp
            wqkv = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).detach()
            bias = None
            if a.q_proj.bias is not None:
                bias = torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]).detach()
            self.layers.append((
                layer.input_layernorm.weight.detach(), Linear(wqkv, bias, quant), Linear(a.o_proj.weight.detach(), quant=quant),
                layer.post_attention_layernorm.weight.detach(),
                Linear(torch.cat([m.gate_proj.weight, m.up_proj.weight]).detach(), quant=quant),
                Linear(m.down_proj.weight.detach(), quant=quant),
            ))
        self.ffn = base.layers[0].mlp.gate_proj.weight.shape[0]
        inv = 1.0 / (_rope_theta(cfg) ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim))
        angles = torch.outer(torch.arange(max_len, dtype=torch.float32), inv)  # (L, D/2)
        emb = torch.cat([angles, angles], -1)
        self.cos, self.sin = emb.cos().to(device, dtype), emb.sin().to(device, dtype)  # (L, D)
        shape = (len(self.layers), 2, self.n_kv, max_len, self.head_dim)
        # On CPU attention runs in float32 (a one-query bf16 q @ K^T over 1,000 keys took 104 us here,
        # float32 37 us), so the cache holds float32 there.
        kv_dtype = torch.float32 if self.manual_attention else dtype
        self.kv = torch.zeros(shape, dtype=kv_dtype, device=device)  # (layers, k|v, KVH, L, D)
        self.model = model

    def reset(self) -> None:
        self.tokens = []

    def truncate(self, n: int) -> None:
        del self.tokens[n:]  # positions >= n are simply overwritten later

    def prefill(self, tokens: Sequence[int], cancel: threading.Event | None = None) -> tuple[torch.Tensor | None, int]:
        return prefill_reusing(self, tokens, cancel)

    @staticmethod
    def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = self.head_dim // 2
        rot = torch.cat([-x[..., half:], x[..., :half]], -1)
        return x * cos + rot * sin

    @torch.inference_mode()
    def forward(self, new_tokens: Sequence[int], keep_logits: int | None = None) -> torch.Tensor:
        """Append tokens; return float32 logits (T', V) of the last `keep_logits` (all by default)."""
        t = len(new_tokens)
        if t == 0:
            raise ValueError("forward needs at least one token")
        if len(self.tokens) + t > self.max_len:
            raise ValueError(f"sequence of {len(self.tokens) + t} tokens exceeds the lean cache ({self.max_len})")
        self.forwards += 1  # one call, however many chunks
        keep = min(keep_logits, t) if keep_logits else t  # 0 or None: all, as before
        if not self.chunk or t <= self.chunk:
            return self._forward(new_tokens, keep)
        pieces = []
        for s in range(0, t, self.chunk):
            piece = new_tokens[s : s + self.chunk]
            want = max(0, keep - (t - s - len(piece)))  # logits wanted from this chunk's tail
            out = self._forward(piece, min(want, len(piece)))
            if want:
                pieces.append(out)
        return torch.cat(pieces) if len(pieces) > 1 else pieces[0]

    def _attend_one(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """One token's attention over keys/values (KVH, L, D): q (H, D) -> (H, D)."""
        kvh, d = keys.shape[0], self.head_dim
        scores = torch.matmul(q.reshape(kvh, -1, d).contiguous(), keys.transpose(1, 2)).mul_(self.scale)  # (KVH, G, L)
        return torch.matmul(torch.softmax(scores, -1), values).reshape(-1, d)

    def _forward(self, new_tokens: Sequence[int], keep: int) -> torch.Tensor | None:
        """One forward of all of `new_tokens`; logits of the last `keep` (None when keep is 0)."""
        start, t = len(self.tokens), len(new_tokens)
        end = start + t
        ids = torch.tensor(list(new_tokens), dtype=torch.long, device=self.device)
        x = self.embed[ids]  # (T, C)
        cos, sin = self.cos[start:end], self.sin[start:end]  # (T, D)
        h, kvh, d = self.n_heads, self.n_kv, self.head_dim
        group = h // kvh
        mask = None
        # decode and verify (the int8 rows) attend one query token at a time, exactly as a decode step
        # does: one matmul over the rows of all T tokens and a longer masked key range gave other bits
        # from T = 4 on (SmolLM2, bf16), and greedy speculation then drifted from plain decoding
        per_token = self.manual_attention and t <= INT8_MAX_ROWS
        if t > 1 and not per_token and (start > 0 or self.manual_attention):  # new token i sees the cache and new tokens 0..i
            mask = torch.ones(t, end, dtype=torch.bool, device=self.device).tril(diagonal=start)  # (T, L)
        if mask is not None and self.manual_attention:
            bias = torch.zeros(t, end, dtype=self.kv.dtype, device=self.device).masked_fill_(~mask, float("-inf"))
            bias = bias.repeat(group, 1)  # rows: the heads sharing a KV head, each with its T queries
        for li, (ln1, wqkv, wo, ln2, wgu, wdown) in enumerate(self.layers):
            qkv = wqkv(self._rms(x, ln1, self.eps))  # (T, (H + 2 KVH) D)
            q, k, v = qkv.split([h * d, kvh * d, kvh * d], -1)
            q = self._rotate(q.view(t, h, d).transpose(0, 1), cos, sin)  # (H, T, D)
            k = self._rotate(k.view(t, kvh, d).transpose(0, 1), cos, sin)  # (KVH, T, D)
            cache = self.kv[li]
            cache[0, :, start:end] = k
            cache[1, :, start:end] = v.view(t, kvh, d).transpose(0, 1)
            keys, values = cache[0, :, :end], cache[1, :, :end]  # (KVH, L, D)
            if per_token:
                qf = q.float()
                att = torch.stack([self._attend_one(qf[:, i], keys[:, : start + i + 1], values[:, : start + i + 1])
                                   for i in range(t)], 1).to(x.dtype)  # (H, T, D)
            elif self.manual_attention:  # the heads sharing a KV head become rows of one query: (KVH, G*T, D)
                scores = torch.matmul(q.float().reshape(kvh, group * t, d), keys.transpose(1, 2)).mul_(self.scale)
                if mask is not None:
                    scores.add_(bias)
                att = torch.matmul(torch.softmax(scores, -1), values).to(x.dtype)  # (KVH, G*T, D) = (H, T, D) in head order
            elif t == 1:  # decode: the heads sharing a KV head become rows of one query, (KVH, G, D)
                att = torch.nn.functional.scaled_dot_product_attention(q.reshape(kvh, group, d), keys, values)
            else:
                if group > 1:
                    keys, values = keys.repeat_interleave(group, 0), values.repeat_interleave(group, 0)
                att = torch.nn.functional.scaled_dot_product_attention(
                    q, keys, values, attn_mask=mask, is_causal=mask is None)  # (H, T, D)
            att = att.reshape(h, t, d).transpose(0, 1).reshape(t, h * d)  # (T, C)
            x = x + wo(att)
            gate, up = wgu(self._rms(x, ln2, self.eps)).split(self.ffn, -1)
            x = x + wdown(torch.nn.functional.silu(gate) * up)
        self.tokens.extend(int(tok) for tok in new_tokens)
        if keep == 0:
            return None
        x = x[-keep:]
        logits = self.lm_head(self._rms(x, self.final_norm, self.eps)).float()
        if self.vocab_limit is not None:
            logits = logits[:, : self.vocab_limit]
        return logits
