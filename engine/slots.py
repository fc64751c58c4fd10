"""Prompt slots: the KV of a few earlier prompts, kept so that going back to a file is not a cold prefill.

The engine keeps one KV cache and reuses the longest common prefix of consecutive prompts, which is
what typing in one file needs. Switching files replaces the prompt's first tokens (the retrieved
chunks, the path, the window), so the cache is prefilled anew (~0.5 s for 512 tokens on two CPU
cores), and going back to the first file pays it again. Before a prompt overwrites most of what the
cache holds, a copy of the held positions is kept here (a few of them, least recently used dropped);
when a later prompt shares more with a kept copy than with the cache, the copy is put back and only
the rest is prefilled. A copy is the positions' K/V (and an EAGLE target's hidden rows) as they
were, so answers are exactly what the cache would have given had it never moved.

Only for backends that can copy their cache (engine.lean.LeanLM: `snapshot`/`restore`); with any
other in the pair, slots stay off.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Sequence

from engine.model import common_prefix_len

log = logging.getLogger(__name__)

# a copy is put back only when it saves at least this many prompt tokens' prefill (a copy back costs
# about as much as prefilling a few tokens: ~26 MB for SmolLM2's 576 positions)
MIN_GAIN = 64


@dataclass
class _Kept:
    tokens: list[int]  # the target's held tokens when the copy was made
    copies: list[Any]  # one snapshot per model (target first)


class PromptSlots:
    def __init__(self, capacity: int, max_tokens: int):
        """`capacity` copies at most (0: off), each of at most `max_tokens` positions."""
        self.capacity, self.max_tokens = max(0, int(capacity)), max_tokens
        self.kept: list[_Kept] = []  # least recently used first
        self.restored = self.saved = 0

    def clear(self) -> None:
        self.kept.clear()

    def stats(self) -> dict[str, int]:
        """For draftline/status: copies kept now, made and put back so far."""
        return {"capacity": self.capacity, "kept": len(self.kept), "saved": self.saved, "restored": self.restored}

    def choose(self, lms: Sequence[Any], prompt: Sequence[int]) -> int:
        """Before `prompt` is prefilled into `lms` (target first, then a draft, if any): keep a copy of
        what the target holds if the prompt would overwrite most of it, and put back the kept copy that
        shares the most with the prompt if it beats the cache by MIN_GAIN tokens. Returns the prompt
        tokens the cache now shares with the prompt."""
        target = lms[0]
        have = common_prefix_len(target.tokens, prompt)
        if not self.capacity or not all(hasattr(lm, "snapshot") for lm in lms):
            return have
        best, best_len = None, have
        for kept in self.kept:
            n = common_prefix_len(kept.tokens, prompt)
            if n > best_len:
                best, best_len = kept, n
        held = min(len(target.tokens), self.max_tokens)
        if best is not None and best_len - have >= MIN_GAIN:
            # out of the list before the cache's own copy goes in: _keep drops near copies and trims the
            # least recently used, either of which could be `best` itself
            self.kept.remove(best)
            self._keep(lms, held)
            for lm, copy in zip(lms, best.copies):
                lm.restore(copy)
            self.restored += 1
            log.debug("prompt slots: put back %d positions (the cache shared %d)", len(best.tokens), have)
            return best_len
        if have < held // 2 and held - have >= MIN_GAIN:  # the prompt would overwrite most of the cache
            self._keep(lms, held)
        return have

    def _keep(self, lms: Sequence[Any], held: int) -> None:
        if held < MIN_GAIN:
            return
        tokens = list(lms[0].tokens[:held])
        # a copy that this one extends or repeats (the same file a few keystrokes earlier) is replaced
        self.kept = [k for k in self.kept if common_prefix_len(k.tokens, tokens) < min(len(k.tokens), held) * 3 // 4]
        self.kept.append(_Kept(tokens, [lm.snapshot(held) for lm in lms]))
        del self.kept[: -self.capacity]
        self.saved += 1
