"""Token trees (issue 21): the drafter proposes a tree, the target verifies every node in one forward
with a tree attention mask, and the longest path it agrees with plus a bonus token is kept."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from engine.speculative import GammaPolicy, _first_token, _logprob, _take
from engine.types import CompletionStats


@dataclass(frozen=True)
class TreeShape:
    """How big a draft tree may be: `nodes` per verify forward (the pending token included), at most
    `depth` drafts along any path and `branch` children per node (the seed: depth <= 4, branch <= 3)."""

    nodes: int = 13
    depth: int = 4
    branch: int = 3


def tree_support(lm) -> str | None:
    """None when `lm` can verify token trees (forward_tree / keep_path), else why not."""
    if getattr(lm, "supports_tree", False):
        return None
    return (f"{type(lm).__name__} has no tree attention (only the lean decoder verifies token trees; "
            "transformers' 4D-mask path is not wired)")


def _children(parents: Sequence[int]) -> list[list[int]]:
    kids: list[list[int]] = [[] for _ in parents]
    for i, p in enumerate(parents):
        if p >= 0:
            kids[p].append(i)
    return kids


def accept_tree_greedy(choice: Sequence[int], tokens: Sequence[int], parents: Sequence[int]) -> list[int]:
    """The longest path from the root (node 0) whose every draft is the target's argmax at its
    parent: node indices, root first. The bonus token is choice[path[-1]]."""
    kids = _children(parents)
    path = [0]
    while True:
        want = choice[path[-1]]
        nxt = next((c for c in kids[path[-1]] if tokens[c] == want), None)
        if nxt is None:
            return path
        path.append(nxt)


def accept_tree_sampled(p: torch.Tensor, tokens: Sequence[int], parents: Sequence[int],
                        generator: torch.Generator | None = None) -> tuple[list[int], int]:
    """SpecInfer's multi-candidate rejection sampling for deterministic drafts: (path, bonus token).

    At a node with target distribution p, its children are tried in order: child c is accepted with
    probability r(c) / sum(r), r starting as p; a rejected child's token gets r = 0. If all are
    rejected the next token is drawn from r / sum(r). Each emitted token is then distributed exactly
    as p (P(c1) = p(c1), P(c2) = (1 - p(c1)) p(c2) / (1 - p(c1)), ...), so the output is the
    target's own sampling."""
    kids = _children(parents)
    path = [0]
    while True:
        node = path[-1]
        residual = p[node].clone()
        for c in kids[node]:
            total = float(residual.sum())
            if total <= 0:
                break
            if float(torch.rand((), generator=generator)) * total < float(residual[tokens[c]]):
                path.append(c)
                break
            residual[tokens[c]] = 0
        else:
            total = float(residual.sum())
            if total <= 0:  # rounding left nothing: any draw from p is then correct
                residual = p[node]
            return path, int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
        if path[-1] == node:  # the loop broke on an empty residual
            return path, int(torch.multinomial(p[node], 1, generator=generator))


def generate_tree(
    target,
    prompt: Sequence[int],
    drafter,
    *,
    max_new_tokens: int,
    cancel: threading.Event,
    shape: TreeShape = TreeShape(),
    gamma: GammaPolicy | None = None,
    eos: frozenset[int] = frozenset(),
    stop_check: Callable[[list[int]], str | None] | None = None,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    stats: CompletionStats | None = None,
    first_allowed: torch.Tensor | None = None,
) -> tuple[list[int], str]:
    """`generate` with token trees: each step the drafter proposes a tree (`propose_tree`), the
    target verifies every node in one forward (`forward_tree`), and the longest path it agrees with
    plus its bonus token is kept (`keep_path` compacts the KV cache to that path).

    The contract is generate's: the same cancel checks, stops, eos, max_new_tokens and stats.
    Greedy output equals plain greedy decoding (bit for bit on the CPU int8 path, where every tree
    row is a decode step's computation); temperature > 0 uses SpecInfer's multi-candidate rejection
    sampling (accept_tree_sampled), distribution-preserving for the deterministic trees the drafters
    propose. `gamma`, when given, caps the tree's depth (and hears each step's accepted depth).
    stats.proposed/accepted count, per step, the tree's depth and the accepted path's drafts (so
    acceptance reads as for chains); stats.tree_nodes the draft nodes verified.
    The target must verify trees (tree_support(target) is None).
    """
    why = tree_support(target)
    if why:
        raise ValueError(why)
    stats = stats if stats is not None else CompletionStats()
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
        depth = min(shape.depth, max_new_tokens - len(out) - 1)
        if gamma is not None:
            depth = min(depth, gamma.gamma(out))
        t0 = time.perf_counter()
        draft, parents = (drafter.propose_tree(list(prompt) + out, shape.nodes - 1, depth, shape.branch)
                          if drafter is not None and depth > 0 else ([], []))
        stats.draft_s += time.perf_counter() - t0
        if cancel.is_set():
            return out, "cancelled"
        t0 = time.perf_counter()
        tokens, tree_parents = [pending, *draft], [-1, *(p + 1 for p in parents)]  # drafts hang from the pending token
        logits = target.forward_tree(tokens, tree_parents)  # (N, V): every node in one forward
        stats.target_forwards += 1
        if temperature <= 0:
            choice = logits.argmax(-1).tolist()
            path = accept_tree_greedy(choice, tokens, tree_parents)
            bonus = int(choice[path[-1]])
        else:
            path, bonus = accept_tree_sampled(torch.softmax(logits / temperature, -1), tokens, tree_parents, generator)
        target.keep_path(path)  # pending + the accepted drafts, at consecutive positions
        chosen = [tokens[i] for i in path[1:]] + [bonus]  # what each path node's row chose
        stats.token_logprobs.extend(_logprob(logits[node], tok) for node, tok in zip(path, chosen))
        stats.verify_s += time.perf_counter() - t0
        n_ok = len(path) - 1
        if draft:
            tree_depth = _depth(parents)
            stats.proposed.append(tree_depth)
            stats.accepted.append(n_ok)
            stats.tree_nodes.append(len(draft))
            if gamma is not None:
                gamma.update(n_ok, tree_depth)
            drafter.feedback(n_ok, tree_depth)
        reason = _take(out, [tokens[i] for i in path[1:]], eos, max_new_tokens, stop_check)
        if reason:
            return out, reason
        pending = bonus


def _depth(parents: Sequence[int]) -> int:
    """The longest root-to-leaf path of drafts (parents[i] < i; -1 hangs from the pending token)."""
    depth: list[int] = []
    for p in parents:
        depth.append(1 if p < 0 else depth[p] + 1)
    return max(depth, default=0)
