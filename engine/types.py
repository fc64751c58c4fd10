"""Torch-free value types shared by the engine and its callers: requests, results, stats."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

Mode = Literal["single-line", "multi-line"]


@dataclass(frozen=True)
class Snippet:
    """A piece of workspace context for the prompt (a retrieved chunk or a definition)."""

    path: str
    text: str
    start_line: int = 1  # 1-based, inclusive
    end_line: int = 1


@dataclass(frozen=True)
class Limits:
    """When a generation stops (whichever comes first)."""

    max_tokens: int = 128
    max_lines: int = 0  # 0 = no line limit
    stop: tuple[str, ...] = ()  # stop strings (the text is cut before them)
    time_budget_s: float = 0.0  # 0 = none; fires only once a full line exists
    min_indent: int = -1  # stop at a later line indented less than this (the scope ended); -1 = off
    # the cursor's line is this much whitespace and nothing else: the answer's first line is checked
    # too, at this plus its own indentation (an empty line inside a body, the cursor at column 0); -1 = not
    lead_indent: int = -1
    # a dedented line that is one of these words (and closers) closes the block, kept as a `}` line is
    # (Lua and Ruby's `end`, the shell's `fi`/`done`/`esac`)
    closer_words: tuple[str, ...] = ()


@dataclass(frozen=True)
class SpecConfig:
    """How the speculative loop drafts and verifies."""

    drafter: Literal["none", "ngram", "draft", "hybrid"] = "hybrid"
    # the drafter of single-line requests ("" = drafter); where a verify costs several plain steps
    # and one-line answers are short, not drafting them wins (bench scenarios)
    single_line_drafter: Literal["", "none", "ngram", "draft", "hybrid"] = ""
    # the draft length: the only one with schedule="fixed", the starting one with adaptive and ast;
    # "grow" ignores it and starts at 8 (engine.speculative.GrowingGamma: the README's ngram-grow numbers)
    gamma: int = 5
    # fixed | adaptive: min(8, max(2, round(acceptance * 10))) over a window |
    # ast: syntax-aware: nesting depth > 5 or acceptance < 0.5 -> 3, acceptance > 0.8 -> 7, else adaptive
    schedule: Literal["fixed", "adaptive", "ast", "grow"] = "adaptive"
    window: int = 8  # steps in the acceptance window
    min_ngram: int = 2  # hybrid: n-gram match length that beats the draft model
    # n-gram drafter: the shortest match it copies from (1 = any token seen before). Where verifying
    # costs more per token (int8 on CPU: 8 tokens ~4 plain steps) short, unreliable matches cost more
    ngram_min: int = 1
    # draft model: stop a proposal at a guess it gives less than this probability (bench scenarios:
    # the bundled draft agrees with the target ~0.6 of the time there; 0 = always propose gamma)
    draft_confidence: float = 0.5
    temperature: float = 0.0
    seed: int = 0
    # token trees (engine.tree.generate_tree): nodes per verify forward, the pending token
    # included; 0 = chains. Only the lean decoder verifies trees (others draft chains). Off by default:
    # on this CPU a 13-node verify costs ~4.6 plain steps against ~2.6 for a depth-4 chain, for ~6-9 %
    # more tokens per step with n-gram drafts (bench scenarios, modes ngram-tree / ngram-d4)
    tree_nodes: int = 0
    tree_depth: int = 4  # drafts along any path (the seed: <= 4)
    tree_branch: int = 3  # children per node (the seed: <= 3)

    def with_overrides(self, *, gamma: int | None = None, drafter: str | None = None,
                       target_only: bool = False) -> SpecConfig:
        """This spec under the monitor's rollback (lsp_server.monitor); no arguments = unchanged.

        ``gamma``: a fixed draft length. ``drafter``: the strongest drafter allowed (none < ngram <
        draft = hybrid), so "ngram" turns hybrid into ngram and leaves ngram or none alone, for
        single-line requests too. ``target_only``: no drafting at all (plain decoding).
        """
        spec = self
        if gamma is not None:
            spec = replace(spec, gamma=max(1, int(gamma)), schedule="fixed")
        cap = "none" if target_only else drafter
        if cap is not None:
            def capped(name: str) -> str:
                return name if not name or DRAFTER_RANK[name] <= DRAFTER_RANK[cap] else cap

            spec = replace(spec, drafter=capped(spec.drafter), single_line_drafter=capped(spec.single_line_drafter))
        return spec


# how much a drafter drafts: the monitor steps down this ladder when drafts are mostly rejected
DRAFTER_RANK = {"none": 0, "ngram": 1, "draft": 2, "hybrid": 2}


@dataclass(frozen=True)
class CompletionRequest:
    """An immutable snapshot of what to complete: document, cursor context, limits."""

    prefix: str
    suffix: str = ""
    uri: str = ""
    version: int = 0
    language: str = ""
    path: str = ""  # workspace-relative path shown to the model
    repo: str = ""  # the workspace folder's name (a repository header where the family has one); "" = none
    snippets: tuple[Snippet, ...] = ()
    mode: Mode = "multi-line"
    limits: Limits = field(default_factory=Limits)


@dataclass
class CompletionStats:
    """What one completion cost and how well the drafts did."""

    prompt_tokens: int = 0
    reused_tokens: int = 0  # prompt tokens whose KV came from the previous call
    generated_tokens: int = 0
    proposed: list[int] = field(default_factory=list)  # per step
    accepted: list[int] = field(default_factory=list)  # per step (draft tokens, bonus excluded)
    tree_nodes: list[int] = field(default_factory=list)  # per token-tree step: draft nodes verified
    target_forwards: int = 0
    draft_forwards: int = 0
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    total_s: float = 0.0
    # log p of each answer token under the target (its own distribution where it chose it; routing's
    # confidence rule reads it); empty where an engine does not say (remote, fake)
    token_logprobs: list[float] = field(default_factory=list)

    @property
    def acceptance(self) -> float:
        proposed = sum(self.proposed)
        return sum(self.accepted) / proposed if proposed else 0.0

    @property
    def accepted_per_step(self) -> float:
        """Tokens emitted per target verify step (accepted drafts + the bonus token)."""
        steps = len(self.proposed)
        return (sum(self.accepted) + steps) / steps if steps else 0.0


@dataclass(frozen=True)
class CompletionResult:
    """The completion text, why it stopped, and its stats."""

    text: str
    cancelled: bool = False
    stop_reason: str = ""  # eos | stop | max_tokens | max_lines | scope | repeat | time | cancelled | error
    tokens: tuple[int, ...] = ()
    stats: CompletionStats = field(default_factory=CompletionStats)
