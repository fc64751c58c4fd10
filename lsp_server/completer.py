"""The completion pipeline: snapshot -> windows (secrets redacted) -> cross-file context -> engine -> post-processing."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from engine.types import CompletionRequest, CompletionResult, CompletionStats, Limits, Snippet
from indexer.files import SECRET_REACH, redact_slices
from indexer.models import Chunk
from lsp_server import postprocess
from lsp_server.context import Context, ContextFinder, build_context
from lsp_server.config import CompletionConfig
from lsp_server.documents import Snapshot, display_path, in_roots, prefix_window, suffix_window, uri_to_path
from lsp_server.engines import Engine

log = logging.getLogger(__name__)


class Retriever(Protocol):
    """Workspace search as the completer needs it (indexer.Index satisfies it)."""

    def search(self, query: str, k: int, exclude: str | None = None) -> Sequence[Chunk]: ...


DEFAULT_SNIPPET_TOKENS = 1433  # an engine that does not say (the fake): 35 % of a 4,096-token prompt


@dataclass
class Completion:
    """A post-processed suggestion with what it cost."""

    text: str
    request: CompletionRequest
    result: CompletionResult | None = None
    chunks: tuple[Snippet, ...] = ()
    timings_ms: dict[str, float] = field(default_factory=dict)
    source: str = "engine"  # engine | cache | type-through
    prompt: str = ""  # the engine's prompt as text, special tokens included (`draftline complete --prompt`)


def repo_name(uri: str, roots: Sequence[Path]) -> str:
    """The name of the innermost workspace folder holding the document ("" when none does)."""
    fs = uri_to_path(uri)
    inside = in_roots(fs, roots) if fs else None  # by name, else with symlinks resolved
    if inside is None:
        return ""
    path = Path(inside)
    for root in sorted(roots, key=lambda r: len(str(r)), reverse=True):
        if path.is_relative_to(os.path.abspath(root)):
            return Path(root).name
    return ""


def build_request(snap: Snapshot, cfg: CompletionConfig, roots: Sequence[Path] = ()) -> CompletionRequest:
    """The engine request for a snapshot (without snippets; those come at run time).

    ``roots``: the workspace folders; the one holding the document names the repository in the
    prompt where the model's template has a repository header (Qwen2.5-Coder, StarCoder2; SmolLM2's
    measured better without one: engine.prompt.SMOLLM).
    """
    before, after = postprocess.to_lf(snap.before), postprocess.to_lf(snap.after)  # lines as the rules see them
    mode = postprocess.choose_mode(before, after, cfg.mode, snap.language)
    max_lines = 1 if mode == "single-line" else cfg.max_lines_multi
    # multi-line: the engine stops as soon as a line leaves the cursor's scope (what postprocess cuts anyway)
    multi = mode == "multi-line"
    min_indent = postprocess.scope_min_indent(before, snap.language, after) if multi else -1
    limits = Limits(max_tokens=cfg.max_tokens, max_lines=max_lines, time_budget_s=cfg.time_budget_s,
                    min_indent=min_indent, lead_indent=postprocess.lead_indent(before) if multi else -1,
                    closer_words=postprocess.closer_words(snap.language), stop=postprocess.stop_strings(snap.language))
    prefix = prefix_window(snap.before, cfg.prefix_chars, cfg.window_quantum)
    suffix = suffix_window(snap.after, cfg.suffix_chars)
    # The model never sees a secret of the open buffer (the index keeps them out of retrieved chunks).
    # The windows are chosen on the real text, then their secret values redacted, line breaks kept;
    # the text around them is scanned too (a key body whose BEGIN line is above the window, a token
    # cut by the cursor). Suggestions still apply to the real buffer (type-through compares snap.before).
    lo = max(0, len(snap.before) - len(prefix) - SECRET_REACH)
    cursor = len(snap.before) - lo
    text = snap.before[lo:] + snap.after[: len(suffix) + 256]  # 256: a token's end past a mid-line cut
    prefix, suffix = redact_slices(text, [(cursor - len(prefix), cursor), (cursor, cursor + len(suffix))])
    return CompletionRequest(
        prefix=prefix,
        suffix=suffix,
        uri=snap.uri,
        version=snap.version,
        language=snap.language,
        path=snap.path,
        repo=repo_name(snap.file_uri or snap.uri, roots),
        mode=mode,
        limits=limits,
    )


def context_for(snap: Snapshot, request: CompletionRequest, cfg: CompletionConfig) -> Context:
    """The cross-file context inputs of a snapshot (cheap: run it on the event loop)."""
    path = snap.file or ""
    return build_context(snap.before, snap.after, request.prefix, path, snap.language, cfg.query_lines)


class Completer:
    """Runs one completion on the calling (engine) thread; pure apart from the engine."""

    def __init__(self, engine: Engine, cfg: CompletionConfig, retriever: Retriever | None = None,
                 roots: Sequence[Path] = ()):
        self.engine = engine
        self.cfg = cfg
        self.retriever = retriever
        self.roots = roots  # snippet paths are shown to the model relative to these
        self.finder = ContextFinder(retriever, roots, display_path) if retriever is not None else None

    def complete(self, request: CompletionRequest, cancel: threading.Event, context: Context | None = None) -> Completion:
        """``context``: from `context_for` (the whole document); without it only the request's windows are known."""
        started = time.perf_counter()
        if context is None:
            path = uri_to_path(request.uri) or ""
            context = build_context(request.prefix, request.suffix, request.prefix, path, request.language,
                                    self.cfg.query_lines)
        chunks = self._retrieve(context)
        retrieved = time.perf_counter()
        # The model sees "\n" line breaks whatever the file's (SmolLM2 answered a CRLF file differently, and
        # its "\r\n" tokens left a "\r" on answers the stop rules cut at "\n"); postprocess gives the
        # answer the document's line ending back. The completion keeps what the engine was given (the
        # monitor's self-check runs it again).
        chunks = tuple(replace(c, text=postprocess.to_lf(c.text)) if "\r" in c.text else c for c in chunks)
        request = replace(request, snippets=chunks)
        shown = replace(request, prefix=postprocess.to_lf(request.prefix), suffix=postprocess.to_lf(request.suffix))
        result = self.engine.complete(shown, cancel)
        text = "" if result.cancelled else self.shape(result.text, request)
        total = time.perf_counter()
        return Completion(text, replace(shown, snippets=()), result, chunks, _timings(started, retrieved, total, result.stats))

    def shape(self, text: str, request: CompletionRequest) -> str:
        # a router gives the template of the model that wrote this answer; the fake engine has none: left to right
        template = getattr(self.engine, "template", None)
        return postprocess.postprocess(text, request.prefix, request.suffix, request.mode, request.limits.max_lines,
                                       request.language, sees_line_rest=getattr(template, "order", "none") != "none")

    def _snippet_tokens(self) -> int:
        """The engine's snippet budget (tokens)."""
        budget = getattr(self.engine, "snippet_budget", None)
        return budget() if callable(budget) else DEFAULT_SNIPPET_TOKENS

    def _digest_tokens(self) -> int:
        """The imports digest's share of the engine's snippet budget (tokens)."""
        return int(self.cfg.digest_share * self._snippet_tokens())

    def _retrieve(self, context: Context) -> tuple[Snippet, ...]:
        if self.finder is None or (self.cfg.snippets <= 0 and self.cfg.definitions <= 0 and self.cfg.digest_share <= 0):
            return ()
        try:
            return self.finder.snippets(context, self.cfg.snippets, self.cfg.definitions, self.cfg.definition_lines,
                                        self._digest_tokens(), getattr(self.engine, "count_tokens", None),
                                        self._snippet_tokens())
        except Exception:  # a broken index must not break completion
            log.exception("retrieval failed")
            return ()


def _timings(started: float, retrieved: float, total: float, stats: CompletionStats) -> dict[str, float]:
    engine_s = total - retrieved
    prefill = min(stats.prefill_s, engine_s)
    return {
        "total": (total - started) * 1e3,
        "retrieve": (retrieved - started) * 1e3,
        "prefill": prefill * 1e3,
        "decode": max(engine_s - prefill, 0.0) * 1e3,
    }

