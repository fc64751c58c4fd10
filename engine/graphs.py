"""CUDA graphs over the lean decoder's short forwards (decode, verify, a token tree): one graph per shape.

For small models, a GPU decode step of a Python forward is mostly launch time. A layer makes 88 aten
calls (torch's profiler, one token), dozens of them kernels, each a few microseconds of host work.
SmolLM2-135M's 270 MB of weights stream in 0.06-0.08 ms at 3.4-4.8 TB/s. A CUDA graph replays the
whole forward as one launch. A graph needs fixed shapes and fixed addresses, so the
graphed forward (`static_forward`) differs from `LeanLM._forward` in three ways:
- the inputs (token ids, the first position, each row's depth and ancestors) are tensors in
  buffers the graph reads, copied in before each replay;
- K/V are written with `index_copy_` at positions computed on the device;
- attention covers a fixed span of the cache (a power of two from 256, or the cache's length) under a
  mask: keys before the first new position, plus each row's ancestors among the new rows. A chain
  of k tokens is the tree where row i's ancestors are rows 0..i.

One graph per (rows, span, tree or chain, hidden kept or not), captured lazily with the real inputs
of its first call (so the warm-up runs compute what the call wants), sharing one memory pool:
graphs replay one at a time, and each result is cloned before the next replay. Without CUDA
(`capture` False: CPU, CI) the same function runs eagerly, which is how the tests check it.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from engine.lean import LeanLM, tree_inputs

MAX_ROWS = 16  # longer forwards (prefill chunks) run eagerly: one launch is no longer most of their time
MIN_SPAN = 256


def span_for(end: int, max_len: int, step: int | None = None) -> int:
    """The attention span a forward ending at position `end` runs over, at most the cache's length:
    the next power of two from MIN_SPAN, or with `step` the next multiple of it (`step` = the cache's
    length: always the whole cache). Powers of two keep a short context from reading the whole cache
    (SmolLM2's K/V at 4k are 94 MB against 270 MB of weights) with few graphs: five for a 4k cache."""
    if step:
        return min(-(-end // step) * step, max_len)
    span = MIN_SPAN
    while span < end:
        span *= 2
    return min(span, max_len)


def static_forward(lm: LeanLM, ids: torch.Tensor, start: torch.Tensor, depth: torch.Tensor, anc: torch.Tensor,
                   span: int) -> torch.Tensor:
    """Float32 logits (N, V) of N new rows after the cache, with shapes fixed by (N, span) only.

    ids (N,): the rows' tokens; start (): the first new position; depth (N,): row i sits at RoPE
    position start + depth[i]; anc (N, N) bool: the rows row i attends to among the new ones. Row
    i's K/V go to slot start + i. Keys at and after start + N are masked, whatever they hold.
    Called under inference mode (LeanLM.forward); undecorated, so that torch.compile can trace it.
    """
    n = ids.shape[0]
    h, kvh, d = lm.n_heads, lm.n_kv, lm.head_dim
    group = h // kvh
    arange = torch.arange(max(n, span), device=ids.device)
    slots = start + arange[:n]  # (N,)
    pos = start + depth
    allowed = arange[:span].unsqueeze(0) < start  # (N, span): the cache before the new rows
    allowed = allowed.expand(n, span).clone().index_copy_(1, slots, anc)
    mask = allowed.repeat(group, 1)  # rows: the heads sharing a KV head, each with its N queries
    x = torch.nn.functional.embedding(ids, lm.embed)  # (N, C)
    cos, sin = lm.cos.index_select(0, pos), lm.sin.index_select(0, pos)  # (N, D)
    for li, (ln1, wqkv, wo, ln2, wgu, wdown) in enumerate(lm.layers):
        qkv = wqkv(lm._rms(x, ln1, lm.eps))  # (N, (H + 2 KVH) D)
        qk = lm._rotate(qkv[:, : (h + kvh) * d].view(n, h + kvh, d).transpose(0, 1), cos, sin)  # (H + KVH, N, D)
        cache_k, cache_v = lm._kv_views[li]  # (KVH, L, D)
        cache_k.index_copy_(1, slots, qk[h:].to(cache_k.dtype))
        cache_v.index_copy_(1, slots, qkv[:, (h + kvh) * d :].view(n, kvh, d).transpose(0, 1).to(cache_v.dtype))
        q = qk[:h].reshape(1, kvh, group * n, d).to(cache_k.dtype)  # the heads sharing a KV head as rows of one query
        # 4-D, so that CUDA's fused (memory-efficient) kernel can take the mask
        att = torch.nn.functional.scaled_dot_product_attention(
            q, cache_k[None, :, :span], cache_v[None, :, :span], attn_mask=mask)  # (1, KVH, G*N, D)
        att = att.to(x.dtype).reshape(h, n, d).transpose(0, 1).reshape(n, h * d)  # (N, C)
        x = x + wo(att)
        gate, up = wgu(lm._rms(x, ln2, lm.eps)).split(lm.ffn, -1)
        x = x + wdown(torch.nn.functional.silu(gate) * up)
    if lm.hidden is not None:
        lm.hidden.index_copy_(0, slots, x)
    return lm.lm_head(lm._rms(x, lm.final_norm, lm.eps)).float()


class Graphs:
    """The graphed forwards of one LeanLM: `run(tokens, start)` for a chain, `run(..., parents=...)` for a tree."""

    def __init__(self, lm: LeanLM, capture: bool | None = None, max_rows: int = MAX_ROWS, compile: str | None = None,
                 pad: bool = False, span_step: int | None = None):
        """`compile`: a torch.compile backend ("inductor" fuses a layer's dozens of small kernels into
        fewer; "eager" only traces, for tests) applied to the forward before capture; one compilation
        per graph shape. None: the forward as written.

        `pad`: every forward runs `max_rows` rows, the real ones first. A row's GEMMs then run the same
        kernels whether it is a decode step or one of a verify's rows (cuBLAS picks its kernel by the
        row count, and two kernels may round differently), so a verify row can be the decode step bit
        for bit; on a memory-bound GPU the padding rows cost little (`bench gpu` prints a k=16 forward
        in steps). One graph per span then serves every forward.

        `span_step`: spans are multiples of it, else powers of two. With pad and span_step = the cache's
        length, every forward has the same shapes (one graph), so a row's bits depend on its own inputs
        only: exact by construction. Padded with bucketed spans, a verify and the decode step at one
        position can still attend over different spans near a bucket's end."""
        self.lm, self.max_rows, self.pad, self.span_step = lm, max_rows, pad, span_step
        self._fn = static_forward if compile is None else torch.compile(static_forward, backend=compile, dynamic=False)
        self.capture = lm.device.type == "cuda" if capture is None else capture
        dev = lm.device
        self._ids = torch.zeros(max_rows, dtype=torch.long, device=dev)
        self._start = torch.zeros((), dtype=torch.long, device=dev)
        self._depth = torch.zeros(max_rows, dtype=torch.long, device=dev)
        self._anc = torch.zeros(max_rows, max_rows, dtype=torch.bool, device=dev)
        self._chain = {n: (torch.arange(n, device=dev), torch.ones(n, n, dtype=torch.bool, device=dev).tril())
                       for n in range(1, max_rows + 1)}
        self._graphs: dict[tuple, tuple[Any, torch.Tensor]] = {}
        self._pool = torch.cuda.graph_pool_handle() if self.capture else None
        # the ids go up from pinned memory without a host sync (a copy from pageable memory costs the
        # host a staged, synchronous copy on every step); the event keeps the next step from rewriting
        # the pinned rows before the previous copy has read them
        pinned = dev.type == "cuda"
        self._ids_host = torch.zeros(max_rows, dtype=torch.long, pin_memory=pinned)
        self._ids_read = torch.cuda.Event() if pinned else None
        self.captures = 0

    def reset(self) -> None:
        """Forget every graph (the cache or the weights they read were replaced)."""
        self._graphs.clear()

    def run(self, tokens: Sequence[int], start: int, parents: Sequence[int] | None = None) -> torch.Tensor:
        """Logits (N, V) of `tokens` after `start` cached positions; writes their K/V at start..start+N-1."""
        n = len(tokens)
        if not 0 < n <= self.max_rows:
            raise ValueError(f"a graphed forward takes 1..{self.max_rows} rows, not {n}")
        if parents is not None and len(parents) != n:
            raise ValueError("one parent per token")
        lm = self.lm
        if start + n > lm.max_len:
            raise ValueError(f"{start + n} positions exceed the lean cache ({lm.max_len})")
        # padded, the real rows come first and the rest attend only to themselves; near the cache's end,
        # where the padding has no room, the real rows run alone
        rows = self.max_rows if self.pad and start + self.max_rows <= lm.max_len else n
        span = span_for(start + rows, lm.max_len, self.span_step)
        if self._ids_read is not None:
            self._ids_read.synchronize()  # done long ago in a decode loop (its argmax synced the host)
        self._ids_host[:rows] = torch.tensor(list(tokens) + [0] * (rows - n), dtype=torch.long)
        self._ids[:rows].copy_(self._ids_host[:rows], non_blocking=self._ids_read is not None)
        if self._ids_read is not None:
            self._ids_read.record()
        self._start.fill_(start)
        buffered = parents is not None or rows > n
        if buffered:
            d, a = tree_inputs(parents if parents is not None else range(-1, n - 1))
            d += [0] * (rows - n)
            a = [r + [False] * (rows - n) for r in a] + [[j == i for j in range(rows)] for i in range(n, rows)]
            self._depth[:rows].copy_(torch.tensor(d))
            self._anc[:rows, :rows].copy_(torch.tensor(a))
            depth, anc = self._depth[:rows], self._anc[:rows, :rows]
        else:
            depth, anc = self._chain[n]
        args = (self._ids[:rows], self._start, depth, anc, span)
        if not self.capture:
            return self._fn(lm, *args)[:n]
        key = (rows, span, buffered, lm.hidden is not None)
        entry = self._graphs.get(key)
        if entry is None:
            entry = self._graphs[key] = self._capture(args)
        graph, out = entry
        graph.replay()
        return out[:n].clone()

    def _capture(self, args: tuple) -> tuple[Any, torch.Tensor]:
        # warm-up on a side stream first (cuBLAS and the allocator set up outside the capture), as
        # torch.cuda.graphs documents; with the call's real inputs, so its K/V writes are the ones wanted
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._fn(self.lm, *args)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = self._fn(self.lm, *args)
        self.captures += 1
        return graph, out
