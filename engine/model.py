"""Load Hugging Face causal LMs and run them behind a prefix-reusing KV cache (what is exact: prefill_reusing)."""

from __future__ import annotations

import inspect
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Sequence

import torch

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def pick_device(device: str | None = None) -> torch.device:
    """CUDA when present, else CPU (an explicit choice wins; "auto" or None chooses)."""
    if device and device != "auto":
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def pick_dtype(device: torch.device, dtype: str = "auto") -> torch.dtype:
    """bf16 on CUDA; float32 on CPU, where batched verification then matches plain decoding.

    bf16 prefills faster on this CPU (reference/bakeoff.md §4) but makes the (k, d) verify GEMM and
    the (1, d) decode GEMM round differently, so near-tie argmaxes can flip; it is opt-in there.
    """
    if dtype != "auto":
        return _DTYPES[dtype]
    return torch.bfloat16 if device.type == "cuda" else torch.float32


class LoadedModel:
    """A causal LM with its tokenizer and where it runs.

    `model` is the transformers model. A directory the lean decoder can run is read without
    transformers (`weights`, a lean.Weights, and tokenizer.FastTokenizer): importing transformers'
    model classes costs ~3 s on this CPU, most of a warm start. Anything that asks for `model`
    then (the transformers backend, benches) loads it on first use.
    """

    def __init__(self, model: Any, tokenizer: Any, name: str, device: torch.device, dtype: torch.dtype, *,
                 weights: Any = None, source: str | None = None, trust_remote_code: bool = False):
        self._model, self.tokenizer, self.name, self.device, self.dtype = model, tokenizer, name, device, dtype
        self.weights, self.source, self.trust_remote_code = weights, source, trust_remote_code

    @property
    def model(self) -> Any:
        if self._model is None:
            self._model = _load_transformers(self.source, self.device, self.dtype, self.trust_remote_code)
        return self._model

    @property
    def config(self) -> Any:
        return self.weights.config if self._model is None and self.weights is not None else self.model.config

    @property
    def vocab_size(self) -> int:
        if self._model is None and self.weights is not None:
            return int(self.weights["lm_head.weight"].shape[0])
        return int(self.model.get_output_embeddings().weight.shape[0])


def _load_transformers(source: str, device: torch.device, dtype: torch.dtype, trust_remote_code: bool,
                       attn_implementation: str | None = None) -> Any:
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code,
                              "local_files_only": Path(source).expanduser().is_dir()}
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, attn_implementation=attn_implementation, **kwargs)
    return model.to(device).eval()


def _load_light(source: str, device: torch.device, dtype: torch.dtype):
    """(tokenizer, lean.Weights) for a directory the lean decoder runs, read without transformers; else None."""
    from engine import lean
    from engine.tokenizer import FastTokenizer

    directory = Path(source).expanduser()
    if not (directory / "config.json").is_file() or not any(directory.glob("*.safetensors")):
        return None
    try:
        config = lean.Config.read(directory)
    except (OSError, ValueError, TypeError):
        return None
    if lean.supports(config) is not None:
        return None
    tokenizer = FastTokenizer.load(directory)
    if tokenizer is None:
        return None
    return tokenizer, lean.Weights.from_dir(directory, dtype, device)


def load_model(
    name_or_path: str,
    *,
    device: str | None = None,
    dtype: str = "auto",
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
    light: bool = True,
) -> LoadedModel:
    """Load a causal LM and its tokenizer: a local HF directory, a hub id, a .gguf file, or the
    name of an installed package that carries a .gguf file (engine/gguf.py converts it once).

    `light`: a local directory the lean decoder runs is read without transformers (see LoadedModel).
    """
    from engine import gguf

    dev = pick_device(device)
    torch_dtype = pick_dtype(dev, dtype)
    started = time.perf_counter()
    source = name_or_path
    if (gguf_file := gguf.resolve_gguf(name_or_path)) is not None:
        source, name_or_path = os.fspath(gguf.converted(gguf_file)), os.fspath(gguf_file)
    local = Path(source).expanduser().is_dir()
    if light and local and attn_implementation is None and (found := _load_light(source, dev, torch_dtype)):
        tokenizer, weights = found
        log.info("loaded %s on %s/%s in %.2fs (lean weights, no transformers)", name_or_path, dev, torch_dtype,
                 time.perf_counter() - started)
        return LoadedModel(None, tokenizer, os.fspath(name_or_path), dev, torch_dtype, weights=weights, source=source,
                           trust_remote_code=trust_remote_code)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code, local_files_only=local)
    model = _load_transformers(source, dev, torch_dtype, trust_remote_code, attn_implementation)
    log.info("loaded %s on %s/%s in %.2fs", name_or_path, dev, torch_dtype, time.perf_counter() - started)
    return LoadedModel(model, tokenizer, os.fspath(name_or_path), dev, torch_dtype, source=source,
                       trust_remote_code=trust_remote_code)


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


# Without a chunk size of its own (transformers, a GPU lean decoder), a prefill that can be cancelled
# runs in pieces of this many tokens: the cancel flag is checked between them. 256 as the lean CPU
# decoder's chunk: a routed block model's time limit overshoots by at most one piece (Gemma-3-270M on
# transformers prefilled a 512-token prompt in one ~700 ms piece past a 150 ms limit, 2026-12-05)
CANCEL_CHUNK = 256


def batched_rows_differ(lm: Any, ids: Sequence[int], rows: int = 8, offsets: Sequence[float] = (0.3, 0.9)) -> float:
    """The largest |difference| between the logits of a `rows`-token forward and the same tokens decoded
    one at a time, at a few offsets into `ids` (2 .. rows tokens each). 0.0: a verify forward's rows are
    the decode steps of plain greedy, and speculation on this model is lossless.

    Not so for every GGUF: on SmolLM2's Q4_1 file (llama-cpp-python 0.3.36, AVX2) a batch of 2-12 rows
    gave logits 0.4-0.9 away from one-at-a-time decoding, and n-gram speculation changed 6 of 12
    held-out answers (`draftline bench llama-server --backend llamacpp`). f32 files of the tiny pair
    were exact, and so was the Q4_1 file on a build without llamafile's kernels (GGML_LLAMAFILE=OFF:
    0.0 at seven offsets), where k-row verifies cost ~0.7 of a step per row, so speculation is exact
    there but slower than plain."""
    worst = 0.0
    for frac in offsets:
        base = max(1, min(len(ids) - rows, int(len(ids) * frac) - rows))
        lm.reset()
        lm.forward(list(ids[:base]), keep_logits=1)
        singles = torch.cat([lm.forward([t])[-1:] for t in ids[base : base + rows]])
        for n in range(2, rows + 1):
            lm.truncate(base)
            batched = lm.forward(list(ids[base : base + n]))
            worst = max(worst, float((batched - singles[:n]).abs().max()))
    lm.reset()
    return worst


def prefill_reusing(lm, tokens: Sequence[int], cancel: threading.Event | None = None,
                    rows: int | None = None) -> tuple[torch.Tensor | None, int]:
    """Make `lm` (CachedLM or LeanLM) hold `tokens`, reusing the longest common prefix.

    Returns (logits of the last position (V,), number of reused tokens). At least the last token
    is always run so its logits are fresh. With `cancel`, the new tokens run in chunks and the
    flag is checked between them: a set flag returns (None, reused) with the chunks done so far
    kept in the cache, where the next keystroke's prompt reuses them.

    `rows` (LeanLM.prefill_rows: the lean decoder with int8/int4 weights): the new tokens run in
    forwards of at most that many tokens (a LeanLM `forward(..., rows=)`).

    What is exact: the reused positions' KV is kept as it was computed, never recomputed, so from
    one cache state speculation gives plain decoding's tokens wherever verify rows are decode steps
    (float32, the lean decoder's int8/int4 path; batched_rows_differ probes llama.cpp).
    A warm cache against a cold one: exact where every forward's rows are computed alone, i.e. the
    lean decoder with quantized weights, whose prefill runs in forwards of at most INT8_MAX_ROWS
    tokens (`rows`), the decode steps' kernels: a position's KV and logits are then the same bits
    whether a cold prefill, a warm prompt's tail, or a decode step (an earlier answer's token)
    computed it. Elsewhere a dense GEMM's rows depend on how many rows it has (MKL's float32 GEMM on
    an AVX2 CPU gave other bits at 1-3, 5-7 and 9-11 rows than in a long chunk), and a warm answer can
    differ from a cold one where a near-tie flips (in float32 by rounding only, ~5e-7 in the logits
    of the tests' tiny models). Before the lean decoder's prefill ran in such pieces, a warm prompt's
    last token went through int8 rows and a cold one's through a dense bf16/float32 chunk, and one
    probe set answered 26 of 87 repeated requests differently.
    """
    if not tokens:
        raise ValueError("prefill needs at least one token")
    reused = min(common_prefix_len(lm.tokens, tokens), len(tokens) - 1)
    lm.truncate(reused)
    tail = tokens[reused:]
    extra = {"rows": rows} if rows else {}
    if cancel is not None:
        step = getattr(lm, "chunk", 0) or CANCEL_CHUNK
        while len(tail) > step:
            if cancel.is_set():
                return None, reused
            lm.forward(tail[:step], keep_logits=1, **extra)
            tail = tail[step:]
        if cancel.is_set():
            return None, reused
    logits = lm.forward(tail, keep_logits=1, **extra)
    return logits[-1], reused


class CachedLM:
    """One model's KV cache over a token sequence: append tokens, get logits, drop a tail.

    This is the backend seam: "run these tokens at the next positions, give logits, keep the first
    n positions". Rejection and cross-call reuse both become `truncate(n)`; nothing before n is
    ever recomputed (kept as computed, which need not be a fresh prefill's bits: see prefill_reusing).
    """

    def __init__(self, model: Any, device: torch.device, vocab_limit: int | None = None):
        self.model = model
        self.device = device
        self.vocab_limit = vocab_limit  # slice logits to a vocabulary shared with another model
        self.tokens: list[int] = []
        self.forwards = 0
        self.capacity = int(getattr(model.config, "max_position_embeddings", 1 << 30))  # positions it can hold
        self._cache = None
        self._said_sliding = False
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"  # transformers >= 5.24 renamed it

    def _new_cache(self):
        """A cache that can always be cropped.

        Built from the config, transformers' DynamicCache keeps only the last window of a
        sliding-window layer (Gemma 2/3, Mistral, some Qwen2 configs) and its `crop` raises once
        that window is full: a real Gemma-3-270M crashed on its first rejected draft, and on the
        next request through prefix reuse. Such a model gets a cache built without the config:
        every layer keeps its whole KV (more memory, bounded by the context), the model still
        applies the window through its attention mask, and crop works, so speculation and prefix
        reuse stay exact (tests/unit/engine/test_sliding_window.py).
        """
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        if any(getattr(layer, "sliding_window", None) for layer in cache.layers):
            if not self._said_sliding:
                log.info("%s: sliding-window layers keep their whole KV here so that drafts can be rolled back",
                         type(self.model).__name__)
                self._said_sliding = True
            return DynamicCache()
        return cache

    def truncate(self, n: int) -> None:
        """Keep the KV of the first n tokens only."""
        drop = len(self.tokens) - n
        if drop <= 0:
            return
        if n == 0 or self._cache is None:
            self._cache = None
        else:
            self._cache.crop(-drop)  # a negative count removes tokens in transformers 4.x and 5.x alike
        del self.tokens[n:]

    @torch.inference_mode()
    def forward(self, new_tokens: Sequence[int], keep_logits: int | None = None) -> torch.Tensor:
        """Append tokens; return logits (T', V) for the last `keep_logits` of them (all by default)."""
        if not new_tokens:
            raise ValueError("forward needs at least one token")
        if self._cache is None:
            self._cache = self._new_cache()
        ids = torch.tensor([list(new_tokens)], dtype=torch.long, device=self.device)  # (1, T)
        start = len(self.tokens)
        positions = torch.arange(start, start + len(new_tokens), device=self.device)
        out = self.model(
            input_ids=ids,
            position_ids=positions.unsqueeze(0),
            cache_position=positions,
            use_cache=True,
            logits_to_keep=keep_logits or 0,
            **{self._cache_kw: self._cache},
        )
        self.forwards += 1
        self.tokens.extend(int(t) for t in new_tokens)
        logits = out.logits[0].float()  # (T', V)
        if self.vocab_limit is not None:
            logits = logits[:, : self.vocab_limit]
        return logits

    def prefill(self, tokens: Sequence[int], cancel: threading.Event | None = None) -> tuple[torch.Tensor | None, int]:
        return prefill_reusing(self, tokens, cancel)

    def reset(self) -> None:
        self._cache = None
        self.tokens = []
