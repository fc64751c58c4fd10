"""The speculative loop: propose -> verify in one target forward -> accept -> adapt gamma."""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable, Protocol, Sequence

import torch

from engine.drafters import Drafter
from engine.model import CachedLM
from engine.types import CompletionStats


class GammaPolicy(Protocol):
    def gamma(self, out: list[int]) -> int:
        """Draft length for the next step, given the tokens generated so far."""
        ...

    def update(self, accepted: int, proposed: int) -> None: ...


class FixedGamma:
    def __init__(self, gamma: int = 5):
        self._gamma = gamma

    def gamma(self, out: list[int]) -> int:
        return self._gamma

    def update(self, accepted: int, proposed: int) -> None:
        pass


class AdaptiveGamma:
    """The seed's rule: start at `initial`, then min(8, max(2, round(acceptance * 10))) over a window."""

    def __init__(self, initial: int = 5, window: int = 8, lo: int = 2, hi: int = 8):
        self._gamma = initial
        self.lo, self.hi = lo, hi
        self.recent: deque[tuple[int, int]] = deque(maxlen=window)

    def acceptance(self) -> float:
        proposed = sum(p for _, p in self.recent)
        return sum(a for a, _ in self.recent) / proposed if proposed else 0.0

    def gamma(self, out: list[int]) -> int:
        return self._gamma

    def update(self, accepted: int, proposed: int) -> None:
        if proposed == 0:
            return
        self.recent.append((accepted, proposed))
        self._gamma = min(self.hi, max(self.lo, round(self.acceptance() * 10)))


class GrowingGamma:
    """For copying drafters (n-gram): double the draft length while whole proposals are accepted,
    halve it on a rejection. On a small model a verify forward of 16 tokens costs little more than
    one of a single token, so a long copy is verified in long strides rather than 8 at a time.
    The engine starts it at 8 (SpecConfig.gamma is not read), so that it moves among 2, 4, 8, 16."""

    def __init__(self, initial: int = 8, lo: int = 2, hi: int = 16):
        self._gamma, self.lo, self.hi = initial, lo, hi

    def gamma(self, out: list[int]) -> int:
        return self._gamma

    def update(self, accepted: int, proposed: int) -> None:
        if proposed == 0:
            return
        self._gamma = min(self.hi, self._gamma * 2) if accepted == proposed else max(self.lo, self._gamma // 2)


class AstAdaptiveGamma(AdaptiveGamma):
    """Syntax-aware: deep nesting or poor recent acceptance -> 3; high acceptance -> 7; else the seed rule.

    `depth(out)` is the tree-sitter nesting depth at the position being generated.
    """

    def __init__(self, depth: Callable[[list[int]], int], initial: int = 5, window: int = 8):
        super().__init__(initial, window)
        self.depth = depth

    def gamma(self, out: list[int]) -> int:
        acc = self.acceptance() if self.recent else None
        if self.depth(out) > 5 or (acc is not None and acc < 0.5):
            return 3
        if acc is not None and acc > 0.8:
            return 7
        return self._gamma


def accept_greedy(target_choice: Sequence[int], proposal: Sequence[int]) -> list[int]:
    """Longest run of the proposal matching the target's argmax, plus the target's next token."""
    n = 0
    while n < len(proposal) and proposal[n] == target_choice[n]:
        n += 1
    return list(proposal[:n]) + [int(target_choice[n])]


def accept_sampled(
    p: torch.Tensor,  # (k+1, V) target probabilities at each verified position
    q: torch.Tensor | None,  # (k, V) draft probabilities; None = deterministic (one-hot) proposal
    proposal: Sequence[int],
    generator: torch.Generator | None = None,
) -> list[int]:
    """Leviathan/Chen rejection sampling: the output is distributed exactly as sampling from p."""
    out: list[int] = []
    for i, tok in enumerate(proposal):
        q_tok = float(q[i, tok]) if q is not None else 1.0
        p_tok = float(p[i, tok])
        if float(torch.rand((), generator=generator)) * q_tok < p_tok:  # accept with min(1, p/q)
            out.append(int(tok))
            continue
        residual = p[i].clone()
        if q is not None:
            residual = torch.clamp(residual - q[i], min=0)
        else:
            residual[tok] = 0
        total = residual.sum()
        if float(total) <= 0:  # p == q numerically; any draw from p is then correct
            residual, total = p[i], p[i].sum()
        out.append(int(torch.multinomial(residual / total, 1, generator=generator)))
        return out
    out.append(int(torch.multinomial(p[len(proposal)], 1, generator=generator)))
    return out


def _choose(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    if temperature <= 0:
        return int(torch.argmax(logits))
    return int(torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=generator))


def generate(
    target: CachedLM,
    prompt: Sequence[int],
    drafter: Drafter | None,
    *,
    max_new_tokens: int,
    cancel: threading.Event,
    gamma: GammaPolicy | None = None,
    eos: frozenset[int] = frozenset(),
    stop_check: Callable[[list[int]], str | None] | None = None,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    stats: CompletionStats | None = None,
    first_allowed: torch.Tensor | None = None,
) -> tuple[list[int], str]:
    """Decode up to `max_new_tokens` after `prompt`; returns (tokens, stop reason).

    Greedy output equals the target's own greedy decoding token for token (up to numerics of the
    batched verify forward; exact in float32 in our tests). `stop_check(tokens)` returns a reason
    to stop after the tokens produced so far (stop strings, line limits, time budgets).
    `first_allowed`: the ids the first token must come from (token healing), chosen the same way
    with or without a drafter.
    The cancel event is checked between prefill chunks and before every propose and every verify.
    """
    stats = stats if stats is not None else CompletionStats()
    gamma = gamma or FixedGamma(5)
    pending = _first_token(target, prompt, cancel, stats, first_allowed, temperature, generator)
    if pending is None:
        return [], "cancelled"
    out: list[int] = []
    while True:
        if pending in eos:
            return out, "eos"
        out.append(pending)
        if len(out) >= max_new_tokens:
            return out, "max_tokens"
        reason = stop_check(out) if stop_check else None
        if reason:
            return out, reason
        if cancel.is_set():
            return out, "cancelled"
        k = min(gamma.gamma(out), max_new_tokens - len(out) - 1) if drafter else 0
        t0 = time.perf_counter()
        proposal = drafter.propose(list(prompt) + out, k) if k > 0 else []
        stats.draft_s += time.perf_counter() - t0
        if cancel.is_set():
            return out, "cancelled"
        t0 = time.perf_counter()
        base = len(target.tokens)
        verify_logits = target.forward([pending, *proposal])  # (1 + k, V) in one forward
        stats.target_forwards += 1
        if temperature <= 0:
            accepted = accept_greedy(verify_logits.argmax(-1).tolist(), proposal)
        else:
            p = torch.softmax(verify_logits / temperature, -1)
            q = getattr(drafter, "last_probs", None) if proposal else None
            accepted = accept_sampled(p, q[: len(proposal)] if q is not None else None, proposal, generator)
        n_ok = len(accepted) - 1
        target.truncate(base + 1 + n_ok)  # keep pending + accepted drafts; drop the rejected tail
        stats.token_logprobs.extend(_logprob(verify_logits[j], tok) for j, tok in enumerate(accepted))
        stats.verify_s += time.perf_counter() - t0
        if proposal:
            stats.proposed.append(len(proposal))
            stats.accepted.append(n_ok)
            gamma.update(n_ok, len(proposal))
            drafter.feedback(n_ok, len(proposal))
        reason = _take(out, accepted[:-1], eos, max_new_tokens, stop_check)
        if reason:
            return out, reason
        pending = accepted[-1]


def _first_token(target, prompt: Sequence[int], cancel: threading.Event, stats: CompletionStats,
                 first_allowed: torch.Tensor | None, temperature: float,
                 generator: torch.Generator | None) -> int | None:
    """Prefill the prompt (reusing the cache) and choose the first token; None when cancelled."""
    if cancel.is_set():
        return None
    t0 = time.perf_counter()
    logits, reused = target.prefill(prompt, cancel)
    stats.prompt_tokens, stats.reused_tokens = len(prompt), reused
    stats.target_forwards += 1
    stats.prefill_s += time.perf_counter() - t0
    if logits is None:  # cancelled between prefill chunks
        return None
    if first_allowed is not None:
        logits = torch.full_like(logits, float("-inf")).index_copy_(0, first_allowed, logits[first_allowed])
    tok = _choose(logits, temperature, generator)  # sampled but not yet in the target's cache
    stats.token_logprobs.append(_logprob(logits, tok))
    return tok


def _logprob(logits: torch.Tensor, tok: int) -> float:
    """log p of `tok` under the target's distribution `logits` (V,): what routing's confidence rule reads."""
    return float(logits[tok] - torch.logsumexp(logits, -1))


def _take(out: list[int], drafts: Sequence[int], eos: frozenset[int], max_new_tokens: int,
          stop_check: Callable[[list[int]], str | None] | None) -> str | None:
    """Append the drafts the target agreed with (already in its cache) to `out`, token by token,
    stopping where plain decoding would have: the same tokens, not a step's overshoot."""
    for tok in drafts:
        if tok in eos:
            return "eos"
        out.append(tok)
        if len(out) >= max_new_tokens:
            return "max_tokens"
        reason = stop_check(out) if stop_check else None
        if reason:
            return reason
    return None
