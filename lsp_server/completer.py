"""Snapshot to suggestion: windows, retrieval, engine, post-processing, caches (LSP and `draftline complete`)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from engine.types import CompletionRequest, CompletionResult, CompletionStats, Limits, Snippet
from indexer.files import SECRET_REACH, redact_slices
from indexer.imports import FileTable
from indexer.models import Chunk
from lsp_server import postprocess
from lsp_server.context import Context, ContextFinder, build_context
from lsp_server.config import WORKSPACE_FILE, CompletionConfig, Config, IndexConfig, ModelConfig, resolve_config
from lsp_server.documents import Snapshot, display_path, prefix_window, suffix_window, uri_to_path

log = logging.getLogger(__name__)


class Retriever(Protocol):
    """Workspace search as the completer needs it (indexer.Index satisfies it)."""

    def search(self, query: str, k: int, exclude: str | None = None) -> Sequence[Chunk]: ...


DEFAULT_SNIPPET_TOKENS = 1433  # an engine that does not say (the fake): 35 % of a 4,096-token prompt


class Engine(Protocol):
    def complete(self, request: CompletionRequest, cancel: threading.Event) -> CompletionResult: ...


def make_engine(model: ModelConfig) -> Engine:
    """The engine configuration asks for (slow for real models: call off the event loop)."""
    remote = model.remote
    if remote not in (None, False) and not (isinstance(remote, Mapping) and remote.get("url") == ""):  # url "": off
        from engine.remote import load_remote

        if not isinstance(remote, Mapping) or remote.get("fallback") != "local":
            return load_remote(remote)  # ValueError for a bad table: the server shows it as a load failure
        return load_remote(remote, fallback=make_engine(replace(model, remote=None)))
    if model.target == "fake":
        if model.fake_fail_load:
            raise RuntimeError("fake engine configured to fail loading")
        from engine.fake import FakeEngine

        return FakeEngine(step_s=model.fake_step_s, text=model.fake_text)
    from engine.bundled import resolve

    target, draft, defaults = resolve(model.target, model.draft)
    options = {**defaults, **model.options}
    from engine.engine import load_engine  # torch lives behind this import

    return load_engine(target, draft, **options)


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


def build_request(snap: Snapshot, cfg: CompletionConfig) -> CompletionRequest:
    """The engine request for a snapshot (without snippets; those come at run time)."""
    mode = postprocess.choose_mode(snap.before, snap.after, cfg.mode)
    max_lines = 1 if mode == "single-line" else cfg.max_lines_multi
    # multi-line: the engine stops as soon as a line leaves the cursor's scope (what postprocess cuts anyway)
    min_indent = postprocess.scope_min_indent(snap.before) if mode == "multi-line" else -1
    limits = Limits(max_tokens=cfg.max_tokens, max_lines=max_lines, time_budget_s=cfg.time_budget_s,
                    min_indent=min_indent)
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
        mode=mode,
        limits=limits,
    )


def context_for(snap: Snapshot, request: CompletionRequest, cfg: CompletionConfig) -> Context:
    """The cross-file context inputs of a snapshot (cheap: run it on the event loop)."""
    path = uri_to_path(snap.uri) or ""
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
        result = self.engine.complete(replace(request, snippets=chunks), cancel)
        text = "" if result.cancelled else self.shape(result.text, request)
        total = time.perf_counter()
        return Completion(text, request, result, chunks, _timings(started, retrieved, total, result.stats))

    def shape(self, text: str, request: CompletionRequest) -> str:
        return postprocess.postprocess(text, request.prefix, request.suffix, request.mode, request.limits.max_lines)

    def _digest_tokens(self) -> int:
        """The imports digest's share of the engine's snippet budget (tokens)."""
        budget = getattr(self.engine, "snippet_budget", None)
        total = budget() if callable(budget) else DEFAULT_SNIPPET_TOKENS
        return int(self.cfg.digest_share * total)

    def _retrieve(self, context: Context) -> tuple[Snippet, ...]:
        if self.finder is None or (self.cfg.snippets <= 0 and self.cfg.definitions <= 0 and self.cfg.digest_share <= 0):
            return ()
        try:
            return self.finder.snippets(context, self.cfg.snippets, self.cfg.definitions, self.cfg.definition_lines,
                                        self._digest_tokens(), getattr(self.engine, "count_tokens", None))
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


@dataclass
class _Shown:
    before: str
    after_head: str
    text: str


class SuggestionCache:
    """Answers without the engine: type-through of the last suggestion, and an LRU of results."""

    def __init__(self, size: int = 1000, suffix_head: int = 200):
        self._size = size
        self._suffix_head = suffix_head
        self._lru: OrderedDict[bytes, str] = OrderedDict()
        self._shown: dict[str, _Shown] = {}

    def lookup(self, snap: Snapshot, request: CompletionRequest) -> tuple[str, str] | None:
        """(text, source) when the cache can answer at once."""
        rest = self._type_through(snap)
        if rest:
            return rest, "type-through"
        text = self._lru.get(_key(request))
        if text:
            self._lru.move_to_end(_key(request))
            return text, "cache"
        return None

    def remember(self, snap: Snapshot, request: CompletionRequest, text: str) -> None:
        if not text:
            return
        self._lru[_key(request)] = text
        self._lru.move_to_end(_key(request))
        while len(self._lru) > self._size:
            self._lru.popitem(last=False)
        self.shown(snap, text)

    def shown(self, snap: Snapshot, text: str) -> None:
        self._shown[snap.uri] = _Shown(snap.before, snap.after[: self._suffix_head], text)

    def forget(self, uri: str) -> None:
        self._shown.pop(uri, None)

    def _type_through(self, snap: Snapshot) -> str:
        last = self._shown.get(snap.uri)
        if last is None or len(snap.before) <= len(last.before):
            return ""
        if snap.after[: self._suffix_head] != last.after_head or not snap.before.startswith(last.before):
            return ""
        typed = snap.before[len(last.before) :]
        return last.text[len(typed) :] if last.text.startswith(typed) else ""


def _key(request: CompletionRequest) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for part in (request.mode, request.path, request.prefix, "\x00", request.suffix):
        h.update(part.encode("utf-8", "surrogatepass"))
    return h.digest()


def describe(completion: Completion) -> dict[str, Any]:
    """The JSON shape of ``draftline complete --json``."""
    stats = completion.result.stats if completion.result else CompletionStats()
    return {
        "text": completion.text,
        "source": completion.source,
        "mode": completion.request.mode,
        "chunks": [{"path": c.path, "start_line": c.start_line, "end_line": c.end_line} for c in completion.chunks],
        "timings_ms": {k: round(v, 3) for k, v in completion.timings_ms.items()},
        "stats": {
            "prompt_tokens": stats.prompt_tokens,
            "reused_tokens": stats.reused_tokens,
            "proposed": sum(stats.proposed),
            "accepted": sum(stats.accepted),
            "generated_tokens": stats.generated_tokens,
            "acceptance": round(stats.acceptance, 4),
        },
        "stop_reason": completion.result.stop_reason if completion.result else "",
    }


def parse_location(location: str) -> tuple[Path, int, int]:
    """``FILE:LINE:COL`` (1-based) to (path, 0-based line, 0-based column)."""
    path, line, col = location.rsplit(":", 2)
    return Path(path), max(int(line) - 1, 0), max(int(col) - 1, 0)


def complete_file(path: Path, line: int, col: int, config: Config, retriever: Retriever | None = None) -> Completion:
    """One completion at a 0-based position of a file on disk (the CLI path, no LSP)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.splitlines(keepends=True)
    offset = sum(len(s) for s in lines[:line]) + min(col, len(lines[line].rstrip("\r\n")) if line < len(lines) else 0)
    roots = [Path(r) for r in getattr(retriever, "roots", ())]
    snap = Snapshot(uri=path.resolve().as_uri(), version=0, language=path.suffix.lstrip("."),
                    path=display_path(str(path.resolve()), roots), before=text[:offset], after=text[offset:])
    started = time.perf_counter()
    engine = make_engine(config.model)
    loaded_ms = (time.perf_counter() - started) * 1e3
    completer = Completer(engine, config.completion, retriever, roots)
    request = build_request(snap, config.completion)
    done = completer.complete(request, threading.Event(), context_for(snap, request, config.completion))
    done.timings_ms["load_model"] = loaded_ms  # not part of "total": the server loads once
    done.prompt = engine.last_prompt_text() if hasattr(engine, "last_prompt_text") else ""
    return done


def run_complete(args: Any) -> int:
    """``draftline complete FILE:LINE:COL``: print the suggestion and its stats."""
    path, line, col = parse_location(args.location)
    workspace = args.workspace or find_workspace(path)
    cli: dict[str, Any] = {"model": {k: v for k, v in (("target", args.target), ("draft", args.draft)) if v}}
    if args.mode:
        cli["completion"] = {"mode": args.mode}
    roots = [workspace] if workspace is not None else []
    config = resolve_config(user_file=args.config, workspace_roots=roots, client_settings=cli)
    if not config.model.target and (missing := _default_missing()):
        print(f"draftline complete: {missing}", file=sys.stderr)
        return 2
    index = open_index([workspace.resolve()], config.index) if workspace is not None else None
    if index is not None:
        index.build()
    try:
        completion = complete_file(path, line, col, config, index)
    finally:
        if index is not None and hasattr(index, "close"):
            index.close()
    if args.prompt:  # what leaves the user's files, as the model sees it
        print(completion.prompt or "(this engine builds no token prompt)")
        print("-" * 40)
    if args.json:
        print(json.dumps(describe(completion), indent=2))
    else:
        print(completion.text)
        info = describe(completion)
        summary = {key: info[key] for key in ("timings_ms", "stats", "chunks")}
        print(json.dumps(summary), file=sys.stderr)
    return 0


def _default_missing() -> str:
    """Why the default model cannot run ("" when it can)."""
    from engine.bundled import resolve

    try:
        resolve("")
    except ValueError as exc:
        return str(exc)
    return ""


def find_workspace(path: Path) -> Path | None:
    """The nearest ancestor holding .git or .draftline.toml; None (no retrieval) when there is none."""
    for parent in path.resolve().parents:
        if (parent / ".git").exists() or (parent / WORKSPACE_FILE).is_file():
            return parent
    return None


def open_index(roots: Sequence[Path], cfg: IndexConfig) -> Retriever | None:
    """The workspace index (indexer.Index, not yet built), or None when disabled, rootless or unavailable."""
    if not cfg.enabled or not roots:
        return None
    try:
        import indexer
    except ImportError:
        log.info("no indexer available: completing without retrieval")
        return None
    options = _index_options(indexer.IndexConfig, cfg.options)
    try:
        return indexer.Index(list(roots), options)
    except Exception:
        log.exception("index with its embedder failed to open; trying BM25 only")
    try:
        return indexer.Index(list(roots), options, embedder=None)
    except Exception:
        log.exception("index failed to open: completing without retrieval")
        return None


_NO_FILES = FileTable()


class IndexHandle:
    """The optional workspace index: opened and built off the loop, fed file events, never fatal.

    It is itself a Retriever (empty until the index is open), so the completer holds it from the start.
    """

    def __init__(self, registry: Any = None) -> None:
        self.registry = registry  # lsp_server.daemon.IndexRegistry: indexes shared between sessions
        self.index: Any = None
        self.state = "none"  # none | building | ready | failed | unavailable
        self._epoch = 0  # bumped by each open and detach
        self._changes = 0  # touch/remove calls, for generation()
        self._changes_by_path: dict[str, int] = {}
        self._watcher: Any = None  # indexer.watch.Watcher over the open index's roots
        self._watch_lock = threading.Lock()

    def open_and_build(self, roots: Sequence[Path], cfg: IndexConfig, progress: Any = None,
                       watch: Any = None) -> None:
        """Blocking: run on a worker thread. A `detach` meanwhile makes this run's result moot.

        ``watch``: where the roots' changes on disk go (an IndexSink: ``touch(path)``, ``remove(path)``,
        called on the watcher's thread); None: nothing watches them.
        """
        self._epoch += 1
        epoch = self._epoch
        index = self.registry.acquire(roots, cfg) if self.registry is not None else open_index(roots, cfg)
        if index is None:
            if cfg.enabled and roots and epoch == self._epoch:
                self.state = "unavailable"  # it could not open (logged): completions go on without retrieval
            return
        if epoch != self._epoch:  # the roots changed while it opened
            self.release(index)
            return
        self.index, self.state = index, "building"
        if watch is not None:  # before the build: a change while it walks is not missed
            self._start_watching(index, watch, epoch)
        try:
            index.build(progress)
            state = "ready"
        except Exception:
            log.exception("indexing failed")
            state = "failed"
        if epoch == self._epoch:
            self.state = state

    def detach(self) -> Any:
        """Forget the current index (the caller closes it); a build still running stops counting.

        Its watcher stops on a thread of its own (joining the observer must not hold up the loop).
        """
        watcher = self._stop_watching()
        if watcher is not None:
            threading.Thread(target=watcher.stop, name="draftline-watch-stop", daemon=True).start()
        old, self.index, self.state = self.index, None, "none"
        return old

    def _start_watching(self, index: Any, sink: Any, epoch: int) -> None:
        try:
            from indexer.watch import watch_index

            watcher = watch_index(index, sink=sink, always=getattr(sink, "always", ()))
        except Exception as exc:  # e.g. the inotify watch limit: the client's file events still work
            log.warning("not watching %s for changes on disk: %s", [str(r) for r in index.roots], exc)
            return
        with self._watch_lock:
            if epoch == self._epoch:
                self._watcher, watcher = watcher, None
        if watcher is not None:  # detached meanwhile
            watcher.stop()

    def _stop_watching(self) -> Any:
        with self._watch_lock:
            self._epoch += 1
            watcher, self._watcher = self._watcher, None
        return watcher

    @property
    def watching(self) -> bool:
        return self._watcher is not None

    def search(self, query: str, k: int, exclude: str | None = None) -> Sequence[Chunk]:
        return self.index.search(query, k, exclude=exclude) if self.index is not None else []

    def definitions(self, name: str) -> Sequence[Any]:
        return self.index.definitions(name) if self.index is not None else []

    def chunk(self, chunk_id: int) -> Any:
        return self.index.chunk(chunk_id) if self.index is not None else None

    def symbols_in(self, path: str) -> Sequence[Any]:
        return self.index.symbols_in(path) if self.index is not None else []

    @property
    def files(self) -> FileTable:
        """The indexed paths by name (import resolution); empty until the index is open."""
        return self.index.files if self.index is not None else _NO_FILES

    def generation(self, path: str) -> tuple[Any, ...]:
        """A value that changes whenever the index may hold new content for files other than ``path``."""
        key = os.path.abspath(path) if path else ""
        return id(self.index), self.state, self._changes - self._changes_by_path.get(key, 0)

    def touch(self, path: str, text: str | None = None) -> None:
        self._count(path)
        self._call("touch", path, text)

    def remove(self, path: str) -> None:
        self._count(path)
        self._call("remove", path)

    def _count(self, path: str) -> None:
        key = os.path.abspath(path)
        self._changes += 1
        self._changes_by_path[key] = self._changes_by_path.get(key, 0) + 1

    def _call(self, method: str, *args: Any) -> None:
        if self.index is None:
            return
        try:
            getattr(self.index, method)(*args)
        except Exception:
            log.exception("index %s failed for %s", method, args[0])

    def stats(self) -> dict[str, Any]:
        if self.index is None:
            return {"state": self.state}
        try:
            stats = self.index.stats()
            numbers = dataclasses.asdict(stats) if dataclasses.is_dataclass(stats) else dict(stats)
            return {"state": self.state, "watching": self.watching, **numbers}
        except Exception as exc:
            return {"state": "error", "error": str(exc)}

    def release(self, index: Any) -> None:
        """Let go of an index this handle held (closed, or left to the sessions that still share it)."""
        if index is None:
            return
        if self.registry is not None:
            self.registry.release(index)
        elif hasattr(index, "close"):
            index.close()

    def close(self) -> None:
        watcher = self._stop_watching()
        if watcher is not None:
            watcher.stop()
        self.release(self.index)


def _index_options(cls: type, options: Mapping[str, Any]) -> Any:
    """The indexer's own config from our ``[index.options]`` table (lists become tuples, paths Paths)."""
    known = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in options.items():
        if key not in known:
            log.warning("index option %r unknown to the indexer", key)
            continue
        if isinstance(value, list):
            value = tuple(value)
        elif isinstance(value, str) and "Path" in str(known[key].type):
            value = Path(value).expanduser()
        kwargs[key] = value
    return cls(**kwargs)
