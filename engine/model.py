"""Load Hugging Face causal LMs and run them behind an exact prefix-reusing KV cache."""

from __future__ import annotations

import inspect
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def pick_device(device: str | None = None) -> torch.device:
    """CUDA when present, else CPU (an explicit choice wins)."""
    if device:
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


@dataclass
class LoadedModel:
    """A causal LM with its tokenizer and where it runs."""

    model: Any
    tokenizer: Any
    name: str
    device: torch.device
    dtype: torch.dtype

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])


def load_model(
    name_or_path: str,
    *,
    device: str | None = None,
    dtype: str = "auto",
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
) -> LoadedModel:
    """Load a causal LM and its tokenizer from a local directory or a hub id."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dev = pick_device(device)
    torch_dtype = pick_dtype(dev, dtype)
    local = Path(name_or_path).expanduser().is_dir()
    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code, "local_files_only": local}
    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(name_or_path, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(
        name_or_path, dtype=torch_dtype, attn_implementation=attn_implementation, **kwargs
    )
    model.to(dev).eval()
    log.info("loaded %s on %s/%s in %.2fs", name_or_path, dev, torch_dtype, time.perf_counter() - started)
    return LoadedModel(model, tokenizer, os.fspath(name_or_path), dev, torch_dtype)


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def prefill_reusing(lm, tokens: Sequence[int]) -> tuple[torch.Tensor, int]:
    """Make `lm` (CachedLM or LeanLM) hold `tokens`, reusing the longest common prefix exactly.

    Returns (logits of the last position (V,), number of reused tokens). At least the last token
    is always run so its logits are fresh.
    """
    if not tokens:
        raise ValueError("prefill needs at least one token")
    reused = min(common_prefix_len(lm.tokens, tokens), len(tokens) - 1)
    lm.truncate(reused)
    logits = lm.forward(tokens[reused:], keep_logits=1)
    return logits[-1], reused


class CachedLM:
    """One model's KV cache over a token sequence: append tokens, get logits, drop a tail.

    This is the backend seam: "run these tokens at the next positions, give logits, keep the first
    n positions". Rejection and cross-call reuse both become `truncate(n)`; nothing before n is
    ever recomputed.
    """

    def __init__(self, model: Any, device: torch.device, vocab_limit: int | None = None):
        self.model = model
        self.device = device
        self.vocab_limit = vocab_limit  # slice logits to a vocabulary shared with another model
        self.tokens: list[int] = []
        self.forwards = 0
        self.capacity = int(getattr(model.config, "max_position_embeddings", 1 << 30))  # positions it can hold
        self._cache = None
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"  # transformers >= 5.24 renamed it

    def _new_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

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

    def prefill(self, tokens: Sequence[int]) -> tuple[torch.Tensor, int]:
        return prefill_reusing(self, tokens)

    def reset(self) -> None:
        self._cache = None
        self.tokens = []
