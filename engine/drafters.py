"""Drafters propose the next tokens cheaply: n-gram lookup, a small model, or a per-step hybrid."""

from __future__ import annotations

from typing import Protocol, Sequence

import torch

from engine.model import CachedLM


class Drafter(Protocol):
    name: str

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        """Up to k guesses for what follows `tokens` (may be empty)."""
        ...

    def feedback(self, accepted: int, proposed: int) -> None:
        """How many of the last proposal the target kept (may be a no-op)."""
        ...


class _NgramTable:
    """For n = 1..max_n: the latest position where each n-gram ended, whose continuation exists."""

    def __init__(self, max_n: int):
        self.max_n = max_n
        self.seq: list[int] = []
        self.tables: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_n + 1)]
        self.indexed = 0  # n-grams ending before this position are in the tables

    def sync(self, tokens: Sequence[int]) -> None:
        """Follow `tokens`: extend incrementally when it only grew, rebuild otherwise."""
        n_old = len(self.seq)
        if len(tokens) < n_old or list(tokens[:n_old]) != self.seq:  # ~20 us at 4k tokens
            self.seq, self.indexed = [], 0
            self.tables = [{} for _ in range(self.max_n + 1)]
        self.seq.extend(tokens[len(self.seq) :])
        # an n-gram ending at j (inclusive) is usable once position j + 1 exists
        for j in range(self.indexed, len(self.seq) - 1):
            for n in range(1, min(self.max_n, j + 1) + 1):
                self.tables[n][tuple(self.seq[j - n + 1 : j + 1])] = j + 1
        self.indexed = max(self.indexed, len(self.seq) - 1)

    def lookup(self, key: tuple[int, ...]) -> int | None:
        return self.tables[len(key)].get(key)


class NgramDrafter:
    """Copies what followed the most recent, longest earlier occurrence of the last n tokens.

    Searches the sequence itself first (the prompt and what was generated so far), then extra
    sequences (retrieved chunks, previous completions), newest first. Zero model cost.
    """

    name = "ngram"

    def __init__(self, max_n: int = 4, min_n: int = 1):
        self.max_n = max_n
        self.min_n = min_n
        self._seq = _NgramTable(max_n)
        self._extra: list[_NgramTable] = []
        self.last_match = 0  # n of the last proposal's match (0 = none)

    def set_extra(self, sequences: Sequence[Sequence[int]]) -> None:
        tables = []
        for s in sequences:
            t = _NgramTable(self.max_n)
            t.sync(list(s) + [-1])  # a sentinel so the final n-gram gets its (empty) continuation
            tables.append(t)
        self._extra = tables[::-1]  # newest first

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        self.last_match = 0
        if k <= 0 or not tokens:
            return []
        self._seq.sync(tokens)
        for n in range(min(self.max_n, len(tokens)), self.min_n - 1, -1):
            key = tuple(tokens[-n:])
            for table in (self._seq, *self._extra):
                start = table.lookup(key)
                if start is None:
                    continue
                guess = [t for t in table.seq[start : start + k] if t >= 0]
                if guess:
                    self.last_match = n
                    return guess
        return []

    def feedback(self, accepted: int, proposed: int) -> None:
        pass


class ModelDrafter:
    """A small LM sharing the target's tokenizer, greedy, with its own prefix-reused cache."""

    name = "draft"

    def __init__(self, lm: CachedLM, p_min: float = 0.0):
        self.lm = lm
        self.p_min = p_min  # stop drafting when the draft's top-1 probability falls below this
        self.last_probs: torch.Tensor | None = None  # (k, V) draft distributions of the last proposal
        self.temperature = 0.0
        # ids the draft cannot embed (target-only rows, e.g. Qwen2.5-Coder 7B's padding above 151,936)
        rows = getattr(lm, "rows", None)  # the lean decoder knows; transformers' model says
        self.rows = int(rows if rows is not None else lm.model.get_input_embeddings().weight.shape[0])

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        self.last_probs = None
        if k <= 0 or not tokens:
            return []
        if max(tokens) >= self.rows:
            tokens = [t if t < self.rows else 0 for t in tokens]  # drafts get worse, never wrong
        logits, _ = self.lm.prefill(tokens)  # (V,)
        out: list[int] = []
        probs: list[torch.Tensor] = []
        for i in range(k):
            p = _probs(logits, self.temperature)
            if self.temperature > 0:
                tok = int(torch.multinomial(p, 1))
            else:
                tok = int(torch.argmax(logits))
            # the draft's own probability of its token (greedy: of its argmax, not the one-hot 1.0):
            # a calibrated draft is rarely right below ~0.4, and each further guess costs a forward.
            # The first guess is always proposed: its forward is paid, verifying it costs little.
            if self.p_min and i > 0 and self._confidence(logits, p, tok) < self.p_min:
                break
            out.append(tok)
            probs.append(p)
            if i + 1 < k:
                logits = self.lm.forward([tok], keep_logits=1)[-1]
        self.last_probs = torch.stack(probs) if probs else None
        return out

    def _confidence(self, logits: torch.Tensor, p: torch.Tensor, tok: int) -> float:
        return float(p[tok]) if self.temperature > 0 else float(torch.softmax(logits, -1)[tok])

    def feedback(self, accepted: int, proposed: int) -> None:
        pass  # the next propose() re-syncs the cache by longest common prefix


class HybridDrafter:
    """Per step: the n-gram proposal when its match is at least `min_match` long, else the model."""

    name = "hybrid"

    def __init__(self, ngram: NgramDrafter, model: ModelDrafter, min_match: int = 2):
        self.ngram = ngram
        self.model = model
        self.min_match = min_match
        self.last_used = "none"

    @property
    def last_probs(self) -> torch.Tensor | None:
        return self.model.last_probs if self.last_used == "draft" else None

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        guess = self.ngram.propose(tokens, k)
        if guess and self.ngram.last_match >= self.min_match:
            self.last_used = "ngram"
            return guess
        self.last_used = "draft"
        return self.model.propose(tokens, k)

    def feedback(self, accepted: int, proposed: int) -> None:
        pass


def _probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    if temperature <= 0:
        return torch.nn.functional.one_hot(torch.argmax(logits), logits.shape[-1]).float()
    return torch.softmax(logits / temperature, dim=-1)
