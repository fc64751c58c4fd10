"""Test doubles for the indexer: a small deterministic embedder that counts its calls."""

from __future__ import annotations

import hashlib
import time

import numpy as np

from indexer.tokens import code_tokens


class FakeEmbedder:
    """Hashed bag-of-tokens vectors: deterministic, fast, and similar texts get similar vectors."""

    def __init__(self, dim: int = 64, delay_s: float = 0.0):
        self._dim = dim
        self.delay_s = delay_s
        self.calls = 0
        self.texts = 0

    @property
    def name(self) -> str:
        return f"fake-{self._dim}"

    @property
    def dim(self) -> int:
        return self._dim

    def embed(self, texts):
        self.calls += 1
        self.texts += len(texts)
        if self.delay_s:
            time.sleep(self.delay_s)
        out = np.zeros((len(texts), self._dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for tok in code_tokens(text):
                h = int.from_bytes(hashlib.blake2b(tok.encode(), digest_size=4).digest(), "little")
                out[i, h % self._dim] += 1.0 if (h >> 31) & 1 else -1.0
            out[i, 0] += 1e-3
        out /= np.linalg.norm(out, axis=1, keepdims=True)
        return out
