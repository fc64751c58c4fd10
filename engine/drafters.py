"""Drafters propose the next tokens cheaply: n-gram lookup, a small model, or a per-step hybrid."""

from __future__ import annotations

import threading
from typing import Protocol, Sequence

import torch

from engine.model import CachedLM


class Drafter(Protocol):
    name: str

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        """Up to k guesses for what follows `tokens` (may be empty).

        Per-request state a model drafter needs (temperature, its random generator, the request's
        cancel flag) is set on it by Engine.complete, so that every drafter keeps this signature:
        benchmarks pass drafters of their own (lsp_server.bench.scenarios.OracleDrafter)."""
        ...

    def feedback(self, accepted: int, proposed: int) -> None:
        """How many of the last proposal the target kept (may be a no-op)."""
        ...


class _NgramTable:
    """For n = 1..max_n: the latest position where each n-gram ended, whose continuation exists.

    With `every`, also every such position, oldest first (token trees copy from several)."""

    def __init__(self, max_n: int, every: bool = False):
        self.max_n = max_n
        self.seq: list[int] = []
        self.tables: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_n + 1)]
        self.every: list[dict[tuple[int, ...], list[int]]] | None = [{} for _ in range(max_n + 1)] if every else None
        self.indexed = 0  # n-grams ending before this position are in the tables

    def sync(self, tokens: Sequence[int]) -> None:
        """Follow `tokens`: extend incrementally when it only grew, rebuild otherwise."""
        n_old = len(self.seq)
        if len(tokens) < n_old or list(tokens[:n_old]) != self.seq:  # ~20 us at 4k tokens
            self.seq, self.indexed = [], 0
            self.tables = [{} for _ in range(self.max_n + 1)]
            if self.every is not None:
                self.every = [{} for _ in range(self.max_n + 1)]
        self.seq.extend(tokens[len(self.seq) :])
        # an n-gram ending at j (inclusive) is usable once position j + 1 exists
        for j in range(self.indexed, len(self.seq) - 1):
            for n in range(1, min(self.max_n, j + 1) + 1):
                key = tuple(self.seq[j - n + 1 : j + 1])
                self.tables[n][key] = j + 1
                if self.every is not None:
                    self.every[n].setdefault(key, []).append(j + 1)
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
        # token trees copy from every occurrence: their own tables, built on the first propose_tree
        self._extra_seqs: list[list[int]] = []  # newest first
        self._tree_seq: _NgramTable | None = None
        self._tree_extra: list[_NgramTable] | None = None

    def set_extra(self, sequences: Sequence[Sequence[int]]) -> None:
        tables = []
        for s in sequences:
            t = _NgramTable(self.max_n)
            t.sync(list(s) + [-1])  # a sentinel so the final n-gram gets its (empty) continuation
            tables.append(t)
        self._extra = tables[::-1]  # newest first
        self._extra_seqs = [list(s) for s in sequences][::-1]
        self._tree_extra = None

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

    # at most this many earlier occurrences are copied into one tree (the newest of the longest
    # matches first); a common single token can occur hundreds of times
    TREE_SOURCES = 24

    def propose_tree(self, tokens: Sequence[int], max_nodes: int, depth: int,
                     branch: int) -> tuple[list[int], list[int]]:
        """A draft tree after `tokens`: (tokens, parents) in BFS order, parents[i] an earlier node
        or -1 (follows tokens[-1]); at most `max_nodes` nodes, `depth` along a path, `branch`
        children per node.

        Every earlier occurrence of the current suffix (longest matches first, then the sequence
        itself before the extra sequences, newest first, as `propose` ranks them) contributes what
        followed it, up to `depth` tokens, merged into a trie: occurrences followed by different
        tokens become branches. The first path is exactly `propose`'s chain.
        """
        self.last_match = 0
        if max_nodes <= 0 or depth <= 0 or branch <= 0 or not tokens:
            return [], []
        if self._tree_seq is None:
            self._tree_seq = _NgramTable(self.max_n, every=True)
        self._tree_seq.sync(tokens)
        if self._tree_extra is None:
            self._tree_extra = []
            for s in self._extra_seqs:
                t = _NgramTable(self.max_n, every=True)
                t.sync(s + [-1])
                self._tree_extra.append(t)
        toks: list[int] = []
        parents: list[int] = []
        kids: dict[tuple[int, int], int] = {}  # (parent, token) -> node
        n_kids: dict[int, int] = {}
        copied: set[tuple[int, int]] = set()  # (table, position): a longer match copied it already
        sources = 0
        for n in range(min(self.max_n, len(tokens)), self.min_n - 1, -1):
            key = tuple(tokens[-n:])
            for ti, table in enumerate((self._tree_seq, *self._tree_extra)):
                for start in reversed(table.every[n].get(key, ())):
                    if (ti, start) in copied:
                        continue
                    copied.add((ti, start))
                    sources += 1
                    parent = -1
                    for tok in table.seq[start : start + depth]:
                        if tok < 0:
                            break
                        node = kids.get((parent, tok))
                        if node is None:
                            if len(toks) >= max_nodes or n_kids.get(parent, 0) >= branch:
                                break
                            node = kids[(parent, tok)] = len(toks)
                            toks.append(tok)
                            parents.append(parent)
                            n_kids[parent] = n_kids.get(parent, 0) + 1
                            self.last_match = self.last_match or n
                        parent = node
                    if len(toks) >= max_nodes or sources >= self.TREE_SOURCES:
                        return _bfs(toks, parents)
        return _bfs(toks, parents)

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
        # sampled guesses draw from this (the engine's draft stream, seeded from SpecConfig.seed), so that
        # a seed reproduces sampled output; None: torch's global generator
        self.generator: torch.Generator | None = None
        # the request's cancel flag (Engine.complete sets it): a cold prefill of a long prompt runs in
        # chunks and stops between them, as the target's does; None: one uninterruptible prefill
        self.cancel: threading.Event | None = None
        # ids the draft cannot embed (target-only rows, e.g. Qwen2.5-Coder 7B's padding above 151,936)
        rows = getattr(lm, "rows", None)  # the lean decoder knows; transformers' model says
        self.rows = int(rows if rows is not None else lm.model.get_input_embeddings().weight.shape[0])

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        self.last_probs = None
        if k <= 0 or not tokens:
            return []
        if max(tokens) >= self.rows:
            tokens = [t if t < self.rows else 0 for t in tokens]  # drafts get worse, never wrong
        logits, _ = self.lm.prefill(tokens, self.cancel)  # (V,)
        if logits is None:  # cancelled between prefill chunks; the loop sees the flag next
            return []
        out: list[int] = []
        probs: list[torch.Tensor] = []
        for i in range(k):
            p = _probs(logits, self.temperature)
            if self.temperature > 0:
                tok = int(torch.multinomial(p, 1, generator=self.generator))
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

    def propose_tree(self, tokens: Sequence[int], max_nodes: int, depth: int,
                     branch: int) -> tuple[list[int], list[int]]:
        """A draft tree from the draft's top-k, level by level (BFS): each level keeps the
        ceil(max_nodes / depth) children (at most `branch` per node) with the highest path
        probability, as EAGLE-2 does. Costs one draft forward per level (the tree so far, verified
        with forward_tree); a draft without trees (transformers) proposes its chain instead.
        (tokens, parents) as NgramDrafter.propose_tree; deterministic (top-k), so the target's
        rejection sampling of trees stays exact at any temperature."""
        self.last_probs = None
        if max_nodes <= 0 or depth <= 0 or branch <= 0 or not tokens:
            return [], []
        if not getattr(self.lm, "supports_tree", False):
            chain = self.propose(tokens, min(depth, max_nodes))
            self.last_probs = None
            return chain, list(range(-1, len(chain) - 1))
        if max(tokens) >= self.rows:
            tokens = [t if t < self.rows else 0 for t in tokens]
        logits, _ = self.lm.prefill(tokens, self.cancel)
        if logits is None:  # cancelled between prefill chunks
            return [], []
        per_level = -(-max_nodes // depth)
        toks: list[int] = []
        parents: list[int] = []
        score: list[float] = []  # log-probability of each node's path
        frontier = [(-1, torch.log_softmax(logits.float(), -1))]
        for _ in range(depth):
            cands = []
            for node, logp in frontier:
                top = torch.topk(logp, min(branch, logp.shape[-1]))
                base = score[node] if node >= 0 else 0.0
                cands += [(base + float(v), node, int(t)) for v, t in zip(top.values, top.indices)]
            cands.sort(key=lambda c: -c[0])
            keep = cands[: min(per_level, max_nodes - len(toks))]
            if not keep:
                break
            first = len(toks)
            for s, node, tok in keep:
                toks.append(tok)
                parents.append(node)
                score.append(s)
            if len(toks) >= max_nodes:
                break
            level_logits = self.lm.forward_tree(toks, parents)[first:]  # the draft's next-token view of each new node
            frontier = [(first + j, torch.log_softmax(level_logits[j], -1)) for j in range(len(keep))]
        return toks, parents

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

    def propose_tree(self, tokens: Sequence[int], max_nodes: int, depth: int,
                     branch: int) -> tuple[list[int], list[int]]:
        """The n-gram tree when its best match is at least `min_match` long, else the model's."""
        tree = self.ngram.propose_tree(tokens, max_nodes, depth, branch)
        if tree[0] and self.ngram.last_match >= self.min_match:
            self.last_used = "ngram"
            return tree
        self.last_used = "draft"
        return self.model.propose_tree(tokens, max_nodes, depth, branch)

    def feedback(self, accepted: int, proposed: int) -> None:
        pass


def _bfs(tokens: list[int], parents: list[int]) -> tuple[list[int], list[int]]:
    """A tree (parents[i] < i, -1 for the roots) reordered breadth first, parents renumbered."""
    depth: list[int] = []
    for p in parents:
        depth.append(0 if p < 0 else depth[p] + 1)
    order = sorted(range(len(tokens)), key=lambda i: (depth[i], i))
    new = {old: i for i, old in enumerate(order)}
    return [tokens[i] for i in order], [new[parents[i]] if parents[i] >= 0 else -1 for i in order]


def _probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    if temperature <= 0:
        return torch.nn.functional.one_hot(torch.argmax(logits), logits.shape[-1]).float()
    return torch.softmax(logits / temperature, dim=-1)
