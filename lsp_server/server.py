"""Every LSP handler: protocol types to domain types, capabilities, engine loading, live metrics."""

from __future__ import annotations

import asyncio
import dataclasses
import contextlib
import logging
import os
import re
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from lsprotocol import types as t
from pygls.lsp.server import LanguageServer
from pygls.protocol import JsonRPCNotification, LanguageServerProtocol
from pygls.protocol.language_server import lsp_method
from pygls.exceptions import (FeatureNotificationError, JsonRpcException, JsonRpcInternalError, JsonRpcInvalidParams,
                              JsonRpcInvalidRequest, JsonRpcParseError, JsonRpcServerNotInitialized)

from lsp_server.completer import Completer, build_request, context_for
from lsp_server.engines import make_engine
from lsp_server.index_handle import IndexHandle
from lsp_server.suggestions import SuggestionCache
from lsp_server.config import WORKSPACE_FILE, Config, IndexSettings, problems_logged, resolve_config
from lsp_server.documents import (ACCEPT_COMMAND, Snapshot, completion_item, cursor, in_notebook, inline_item,
                                  notebook_json, snapshot, uri_to_path, use_lsp_lines, with_selection)
from lsp_server import metrics
from lsp_server.monitor import Monitor, monitor_for
from lsp_server.scheduler import Scheduler, Telemetry, rss_mb

log = logging.getLogger(__name__)

STATUS = "draftline/status"
DID_SHOW = "textDocument/didShowCompletion"
DID_PARTIALLY_ACCEPT = "textDocument/didPartiallyAcceptCompletion"
_WORD_START = re.compile(r"\w")  # what follows the cursor starts a word (completion.inside_words)


class DraftlineProtocol(LanguageServerProtocol):
    """pygls' protocol, with the JSON-RPC and LSP rules it leaves out: a request whose params do not
    parse gets -32602 instead of silence, one with no params member is read as params null (JSON-RPC
    allows it), one with an id that is neither a number nor a string gets -32600; before
    ``initialize`` a request gets -32002 and a notification is dropped (LSP), a second ``initialize``
    gets -32600 (it reset the session: open documents, roots); a notification that does not parse is
    logged and dropped. In a daemon's session `exit` ends the session (its connection), not the process."""

    session_stop: threading.Event | None = None  # set by lsp_server.daemon for each connection
    _initialize_seen = False

    _exited = False

    @lsp_method(t.EXIT)
    def lsp_exit(self, *args: Any):
        self._exited = True
        if self.session_stop is None:
            yield from super().lsp_exit(*args)
            return
        if (user_handler := self.fm.features.get(t.EXIT)) is not None:
            yield user_handler, args, None
        self.session_stop.set()
        if self.writer is not None:
            self.writer.close()

    def handle_message(self, message: Any) -> None:
        method = getattr(message, "method", None)
        request = method is not None and getattr(message, "id", None) is not None
        if method == DROPPED:
            return
        if request and method == t.INITIALIZE:
            if self._initialize_seen:
                error = JsonRpcInvalidRequest("initialize: the session is initialized already")
                self._send_response(message.id, error=error.to_response_error())
                return
            self._initialize_seen = True
        elif method is not None and not self._initialize_seen and method != t.EXIT:
            if request:
                error = JsonRpcServerNotInitialized(f"{method}: the server is not initialized yet")
                self._send_response(message.id, error=error.to_response_error())
            else:
                log.warning("a %s notification before initialize (dropped)", method)
            return
        if self._shutdown and method != t.EXIT and request:
            error = JsonRpcInvalidRequest(f"{method}: the server is shutting down")  # LSP; pygls kept silent
            self._send_response(message.id, error=error.to_response_error())
            return
        super().handle_message(message)

    def structure_message(self, data: dict[str, Any]):
        if "jsonrpc" in data and "method" in data:
            msg_id = data.get("id")
            if "id" in data and (not isinstance(msg_id, (int, str)) or isinstance(msg_id, bool)):
                error = JsonRpcInvalidRequest(f"{data['method']}: an id must be a number or a string")
                self.send_error_without_id(error)
                return JsonRPCNotification(method=DROPPED, jsonrpc="2.0", params=None)
            data.setdefault("params", None)
        try:
            return super().structure_message(data)
        except Exception as exc:
            if "jsonrpc" not in data or "method" not in data:
                raise
            if "id" not in data:  # a notification: nobody to answer, and no reason to bother the user
                log.warning("a %s notification with invalid params (dropped): %s", data["method"], exc.__cause__ or exc)
                return JsonRPCNotification(method=DROPPED, jsonrpc="2.0", params=None)
            error = JsonRpcInvalidParams(f"invalid params for {data.get('method')}: {exc.__cause__ or exc}")
            self._send_response(data["id"], error=error.to_response_error())
            return JsonRPCNotification(method=DROPPED, jsonrpc="2.0", params=None)

    def _send_data(self, data: Any):
        """Nothing after `exit`: the channel is closed (a reply to a generation cancelled by the exit
        logged 'Error sending data ... I/O operation on closed file' with its traceback)."""
        if self._exited:
            return
        try:
            super()._send_data(data)
        except BrokenPipeError:
            # the client's end of stdout is gone (it died, or closed the pipe): every later message was a
            # traceback more in the log until stdin closed too. Nothing more is sent.
            log.warning("the client closed the channel: nothing more is sent")
            self._exited = True

    def send_error_without_id(self, error: JsonRpcException) -> None:
        """An error reply with ``"id": null`` (JSON-RPC, where the id is unknown; pygls' own reply drops a
        null id)."""
        reply = error.to_response_error()
        self._send_data({"jsonrpc": "2.0", "id": None, "error": {"code": reply.code, "message": reply.message}})


DROPPED = "$/draftline/dropped"  # what an invalid message becomes once answered or logged


class DraftlineServer(LanguageServer):
    """pygls' server, but a notification that fails is logged, not shown: pygls pops up "Error in
    server: KeyError" in the editor for what is mostly a client's slip (a change to a document it never
    opened, a cancel with an odd id), and the server goes on either way. A body that is not JSON gets
    the -32700 reply JSON-RPC asks for (id null), and a log line."""

    def report_server_error(self, error: Exception, source: Any) -> None:
        if source is FeatureNotificationError:
            log.warning("a notification failed (ignored): %s: %s", type(error).__name__, error)
            return
        if source is JsonRpcInternalError:  # a write to the client failed: telling the client fails too
            return  # (pygls then reported that failure, and so on: 9 MB of tracebacks after an `exit`)
        if source is JsonRpcException:  # a message that could not be read at all
            if isinstance(error, ValueError):  # json.JSONDecodeError
                with contextlib.suppress(Exception):
                    self.protocol.send_error_without_id(JsonRpcParseError(f"not JSON: {error}"))
            log.warning("a message could not be read (ignored): %s: %s", type(error).__name__, error)
            return
        super().report_server_error(error, source)


def model_label(model) -> str:
    """What draftline/status calls the model: its target, or the default's name when none is set
    (clients used to read the empty string as "no model" while it was serving)."""
    from engine.bundled import DEFAULT_LABEL

    remote = model.remote
    if isinstance(remote, Mapping) and remote.get("url"):
        return f"remote:{remote.get('model') or remote['url']}"
    return model.target or DEFAULT_LABEL


@dataclass
class EngineSlot:
    """Where the model stands: empty | loading | ready | failed."""

    state: str = "empty"
    completer: Completer | None = None
    error: str = ""


class Draftline:
    """Server state owned by the event loop; the engine lives on the scheduler's thread."""

    def __init__(self, ls: LanguageServer, user_config: Path | None = None, shared: Any = None):
        self.ls = ls
        self.shared = shared  # lsp_server.daemon.Shared: the engine thread, engines, indexes (serve --tcp)
        self.session = shared.session_id() if shared is not None else ""
        self._metrics_id = metrics.track(self)  # serve --metrics-port reads status() of every live session
        self.user_config = user_config
        self.config = Config()
        self.init_options: Any = None
        self.client_settings: dict[str, Any] | None = None  # the last didChangeConfiguration push
        self.scheduler = shared.scheduler if shared is not None else Scheduler()
        self.cache = SuggestionCache()
        self.telemetry = Telemetry()
        self.slot = EngineSlot()
        self._wanted_model: Any = None  # the model the latest switch asked for: other loads are skipped or dropped
        self._pending_loads: list[Any] = []  # models whose load is queued or running (one each)
        self._held_model: Any = None  # the model whose shared engine the slot holds (a daemon's session)
        self.monitor: Monitor | None = None  # the rollback rules of the ready engine (lsp_server.monitor)
        # a Retriever that is empty until the workspace index is open
        self.index = IndexHandle(shared.indexes if shared is not None else None)
        self.index.yield_to = self.scheduler.yield_to_generation  # indexing waits a moment for a generation
        self.disk_changes = DiskChanges()  # the client's file events and our watcher's, deduplicated
        self.roots: list[Path] = []
        self.last_chunks: list[str] = []
        self._overlay_timers: dict[str, asyncio.TimerHandle] = {}  # uri -> pending re-index of its buffer
        self._overlaid: set[str] = set()  # uris whose unsaved text this session put into the index
        self._index_started = False
        self._config_watch: ConfigWatch | None = None  # the roots' .draftline.toml, index or not
        self._closed = False
        self._shown_problems: list[str] = []  # the configuration's problems last shown to the user

    # -- configuration and the engine ------------------------------------------------------------
    def configure(self, client_settings: Any = None) -> None:
        """Re-resolve every layer; a push without a settings object keeps the last one."""
        if isinstance(client_settings, dict):
            self.client_settings = client_settings
        old = self.config
        with problems_logged() as problems:
            self.config = resolve_config(
                user_file=self.user_config,
                workspace_roots=self.roots,
                init_options=self.init_options,
                client_settings=self.client_settings,
            )
        if problems and problems != self._shown_problems:  # once, not again at each identical re-read
            more = f" (and {len(problems) - 1} more: see the server's log)" if len(problems) > 1 else ""
            self.ls.window_show_message(t.ShowMessageParams(
                type=t.MessageType.Warning, message=f"draftline: {problems[0]}{more}"))
        self._shown_problems = problems
        if old != self.config:  # other settings or another model: old suggestions do not hold
            self.cache = SuggestionCache(self.config.completion.cache_size)
        if self.slot.completer is not None:
            self.slot.completer.cfg = self.config.completion
        if self.monitor is not None and old.monitor != self.config.monitor:
            self.monitor.reconfigure(self.config.monitor)  # every rule starts over (target-only too)
        if self._index_started and _index_needs_rebuild(old.index, self.config.index):
            log.info("index settings changed: re-indexing")
            asyncio.ensure_future(self.reindex())
        if self.slot.state == "empty" or old.model != self.config.model:
            self._cancel_jobs()  # the old model's generations: their answers would be dropped anyway
            self.slot = EngineSlot("loading")  # from now on requests answer empty until ready
            self._release_engine()  # the daemon frees it once no session uses it
            self.monitor = None  # the next engine gets its own
            self._wanted_model = self.config.model
            if self.config.model not in self._pending_loads:  # A -> B -> A while A loads: A's load still serves
                self._pending_loads.append(self.config.model)
                asyncio.ensure_future(self._load_pending(self.config))

    async def load_engine(self, config: Config) -> None:
        """Load ``config.model`` and install it, unless a switch to another model came since: a queued
        load that is no longer wanted does not run, one that ran is dropped, not installed."""
        self._wanted_model = config.model
        self._pending_loads.append(config.model)
        await self._load_pending(config)

    async def _load_pending(self, config: Config) -> None:
        try:
            # A load skipped (or dropped) because another model was wanted at its turn, while the switch
            # back to this one found it still pending and queued none: it runs again
            while not await self._load(config) and config.model == self._wanted_model:
                pass
        finally:
            self._pending_loads.remove(config.model)

    async def _load(self, config: Config) -> bool:
        """Whether this load settled the slot (installed the engine, or reported its failure); False
        when it was no longer wanted at its turn or once loaded."""
        def wanted() -> bool:  # asked on the engine thread too (a reference the loop sets: no lock needed)
            return config.model == self._wanted_model

        try:
            if self.shared is not None:  # the daemon loads each model once, for every session: asked for
                if not await self.scheduler.call(wanted):  # only if still wanted at this session's turn there
                    return False
                engine = await self.shared.engine(config.model)
            else:
                engine = await self.scheduler.call(lambda: make_engine(config.model) if wanted() else None)
        except Exception as exc:
            log.exception("model failed to load")
            if not wanted():
                return False  # superseded by another model while loading
            self.slot = EngineSlot("failed", error=f"{type(exc).__name__}: {exc}")
            message = f"draftline: model {config.model.target!r} failed to load: {self.slot.error}"
            self.ls.window_show_message(t.ShowMessageParams(type=t.MessageType.Error, message=message))
            return True
        if engine is None or not wanted():
            if engine is not None and self.shared is not None:
                self.shared.release_engine(config.model)  # loaded for nothing: this session does not hold it
            return False
        self._release_engine()
        if self.shared is not None:
            self._held_model = config.model
        self.slot = EngineSlot("ready", Completer(engine, self.config.completion, self.index, self.roots))
        self.monitor = monitor_for(engine, self.config.monitor, _engine_runner(self.scheduler))
        log.info("model %r ready", config.model.target)
        return True

    # -- completion ------------------------------------------------------------------------------
    def document(self, uri: str):
        return self.ls.workspace.text_documents.get(unquote(uri))

    def is_current(self, snap: Snapshot) -> bool:
        """Whether the document is still the one the snapshot was taken of: its version, and the same
        opening of it (an editor closing and reopening a file starts again at version 1)."""
        doc = self.document(snap.uri)
        return doc is not None and (doc.version or 0) == snap.version and getattr(doc, "serial", 0) == snap.serial

    async def suggest(self, uri: str, position: t.Position, selected: t.SelectedCompletionInfo | None = None,
                      invoked: bool = False):
        """(snapshot, text) for a cursor, or None (empty answer). Never raises but CancelledError.
        ``invoked``: the user asked (not an editor's automatic request while typing)."""
        started = time.perf_counter()
        self.telemetry.requests += 1
        try:
            found = await self._suggest(uri, position, selected, invoked)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("completion failed")
            self.telemetry.errors += 1
            found = None
        finally:
            self.telemetry.latencies_ms.append((time.perf_counter() - started) * 1e3)
        if found is None:
            self.telemetry.empty += 1
        else:
            self.telemetry.answered += 1
        return found

    async def _suggest(self, uri: str, position: t.Position, selected: t.SelectedCompletionInfo | None,
                       invoked: bool = False):
        doc = self.document(uri)
        snap = doc and snapshot(doc, position.line, position.character, self.roots)
        if snap and selected is not None:
            snap = with_selection(snap, doc, selected.range, selected.text, position)
        if not snap:
            return None
        if not invoked and not self.config.completion.inside_words and _WORD_START.match(snap.after):
            return None  # the cursor is inside or before a word: nothing to insert unasked
        snap = in_notebook(snap, self.ls.workspace, self.roots)  # after with_selection: it works in the cell's offsets
        request = build_request(snap, self.config.completion, self.roots)
        hit = self.cache.lookup(snap, request)
        if hit is not None:
            self._count_hit(hit[1])
            self.cache.shown(snap, hit[0])
            return snap, hit[0]
        text = await self._generate(snap, request)
        return (snap, text) if text else None

    async def _generate(self, snap: Snapshot, request) -> str:
        """The engine's text for a snapshot; "" when not ready, superseded, cancelled or stale."""
        # what the answer belongs to: a model switch during the await replaces the slot and the cache
        slot, cache, monitor = self.slot, self.cache, self.monitor
        completer = slot.completer
        if completer is None:
            return ""

        context = context_for(snap, request, self.config.completion)

        def job(cancel):  # on the engine thread: never start for a version that already moved
            if not self.is_current(snap):
                return None
            done = completer.complete(request, cancel, context)
            if done.result is not None and done.result.cancelled:  # counted here: a $/cancelRequest leaves
                self.telemetry.engine_cancelled += 1  # no awaiting caller to count it
            return done

        done = await self.scheduler.submit(self.job_key(snap.uri), job, self.config.completion.debounce_ms / 1e3)
        if done is not None and done.result is not None:
            stats = done.result.stats
            self.telemetry.engine_runs += 1
            self.telemetry.prompt_tokens += stats.prompt_tokens
            self.telemetry.recomputed_tokens += max(stats.prompt_tokens - stats.reused_tokens, 0)
            if log.isEnabledFor(logging.DEBUG):  # `draftline -v serve`: what each engine run cost
                ms = done.timings_ms
                log.debug("completion v%d: prompt %d (reused %d), %d new, %s; retrieve %.0f prefill %.0f decode %.0f "
                          "total %.0f ms", snap.version, stats.prompt_tokens, stats.reused_tokens,
                          stats.generated_tokens, done.result.stop_reason, ms.get("retrieve", 0.0),
                          ms.get("prefill", 0.0), ms.get("decode", 0.0), ms.get("total", 0.0))
            if monitor is not None:
                monitor.observe_completion(done)
        if done is None or not done.text or (done.result and done.result.cancelled):
            return ""
        if slot is not self.slot:
            return ""  # the old model's answer: neither shown nor remembered (the cache key has no model)
        if not self.is_current(snap):
            self.telemetry.stale += 1
            return ""
        cache.remember(snap, request, done.text)
        self.last_chunks = [f"{c.path}:{c.start_line}-{c.end_line}" for c in done.chunks]
        return done.text

    def wants_fallback(self) -> bool:
        """Answer textDocument/completion? By default only for clients without inline completion."""
        setting = self.config.completion.fallback
        text_caps = self.ls.client_capabilities.text_document
        return setting == "always" or (setting == "auto" and not (text_caps and text_caps.inline_completion))

    def _count_hit(self, source: str) -> None:
        if source == "type-through":
            self.telemetry.type_through += 1
        else:
            self.telemetry.cache_hits += 1

    # -- documents and the index -----------------------------------------------------------------
    async def start_index(self) -> None:
        """Open and build the workspace index on a worker thread; retrieval uses it once open."""
        self._index_started = True  # from now on, a change of [index] settings re-indexes
        self.watch_config()
        if not (self.config.index.enabled and self.roots):
            return
        loop = asyncio.get_running_loop()
        progress = IndexProgress(self.ls, loop) if self._client_shows_progress() else None
        if progress is not None:
            await progress.start()
        try:
            report = progress.report if progress else None
            watch = WatchSink(loop, self.disk_changed)
            await in_daemon_thread(self.index.open_and_build, list(self.roots), self.config.index, report, watch)
        finally:
            if progress is not None:
                progress.end()
        self._overlay_buffers()

    def _overlay_buffers(self) -> None:
        """The session's unsaved buffers into the index just opened (built: a touch that came while it
        was building waits for the build anyway): a buffer overlaid before it opened (edited while there
        was none, or in the index it replaces) would otherwise be missing until its next edit."""
        if self._closed:
            return
        for uri in list(self._overlaid):
            self.index_touch(uri, self.buffer_text(uri))  # None: no longer open, the disk's text then

    async def reindex(self) -> None:
        """The roots changed: close the old index and its watcher (off the loop) and index the new roots."""
        overlaid = set(self._overlaid)
        self._drop_overlays()  # the old index may live on for other sessions of a daemon
        self._overlaid |= overlaid  # still unsaved: the new index gets them once open (start_index)
        old = self.index.detach()
        self.disk_changes.clear()
        if old is not None and hasattr(old, "close"):
            await in_daemon_thread(self.index.release, old)
        await self.start_index()

    def watch_config(self) -> None:
        """Watch the roots' ``.draftline.toml`` (again where the roots changed), index or not (its
        watcher runs only with an index, and may ignore the file), and whether or not the client
        reports file events."""
        roots = tuple(self.roots)
        if self._closed or (self._config_watch is not None and self._config_watch.roots == roots):
            return
        if self._config_watch is not None:
            self._config_watch.stop()
        self._config_watch = ConfigWatch.start(roots, asyncio.get_running_loop(), self.disk_changed)

    def _client_shows_progress(self) -> bool:
        window = self.ls.client_capabilities.window
        return bool(window and window.work_done_progress)

    def job_key(self, uri: str) -> str:
        """The scheduler's key for a document: unquoted like pygls' documents, and this session's own."""
        return f"{self.session}:{unquote(uri)}" if self.session else unquote(uri)

    def _cancel_jobs(self) -> None:
        """Stop what this session runs or queues on the engine thread (a daemon's: only its own keys)."""
        if self.shared is None:
            self.scheduler.cancel_prefix("")
        elif self.session:
            self.scheduler.cancel_prefix(f"{self.session}:")

    def close(self) -> None:
        """End the session: at ``shutdown``, and again when a daemon's session ends (then a no-op).

        Its pending buffer re-indexes are cancelled and its unsaved buffers leave the index first: a
        daemon's index is shared, and would otherwise prefer a gone editor's text to the disk's.
        """
        if self._closed:
            return
        self._closed = True
        metrics.untrack(self._metrics_id)  # not left to the GC: a reference cycle kept it exported as live
        for timer in self._overlay_timers.values():
            timer.cancel()
        self._overlay_timers.clear()
        self._drop_overlays()
        if self._config_watch is not None:
            self._config_watch.stop()
            self._config_watch = None
        if self.shared is None:  # a daemon's engine thread outlives its sessions
            self.scheduler.close()
        else:  # but what this session asked for stops now, not when its generation ends
            self._cancel_jobs()
            self._wanted_model = None  # a load still pending installs (and holds) nothing
            self._release_engine()  # and its engine is freed unless another session uses it
        self.index.close()

    def _release_engine(self) -> None:
        """A daemon's session lets go of the shared engine its slot held (a switch, or the end)."""
        if self._held_model is not None:
            model, self._held_model = self._held_model, None
            self.shared.release_engine(model)

    def _drop_overlays(self) -> None:
        """Back to the disk's text for every buffer this session overlaid on the index."""
        for uri in self._overlaid:
            self.index.touch(uri_to_path(uri), None)
        self._overlaid.clear()

    def edited(self, uri: str, text: str | None, immediate: bool = True) -> None:
        """Every open/change: stop what runs for this document now, then refresh the index overlay.

        A change re-indexes the buffer only once typing pauses (``index.overlay_delay_ms``): re-chunking,
        embedding and committing a file per keystroke would take the CPU from the completions.
        """
        self.scheduler.cancel(self.job_key(uri))
        timer = self._overlay_timers.pop(uri, None)
        if timer is not None:
            timer.cancel()
        delay = self.config.index.overlay_delay_ms / 1e3
        if immediate or delay <= 0:
            self.index_touch(uri, text)
            return
        self._overlay_timers[uri] = asyncio.get_running_loop().call_later(delay, self._overlay_due, uri)

    def _overlay_due(self, uri: str) -> None:
        self._overlay_timers.pop(uri, None)
        text = self.buffer_text(uri)
        if text is not None:
            self.index_touch(uri, text)

    def buffer_text(self, uri: str) -> str | None:
        """What the editor holds for ``uri``: a document's text, or an open notebook as notebook JSON
        (the index reads its code cells out of it as it does from the file); None when neither is open."""
        doc = self.document(uri)
        if doc is not None:
            return doc.source
        notebook = self.ls.workspace.get_notebook_document(notebook_uri=uri)
        return notebook_json(notebook, self.ls.workspace) if notebook is not None else None

    def index_touch(self, uri: str, text: str | None) -> None:
        if text is None:
            self._overlaid.discard(uri)
            if (timer := self._overlay_timers.pop(uri, None)) is not None:
                timer.cancel()  # saved or closed: the file on disk is what counts now
        path = uri_to_path(uri)
        if path:
            if text is not None:
                self._overlaid.add(uri)
            self.index.touch(path, text)

    def file_event(self, event: t.FileEvent) -> None:
        """The client's ``workspace/didChangeWatchedFiles``."""
        path = uri_to_path(event.uri)
        if path:
            self.disk_changed(path, event.type == t.FileChangeType.Deleted)

    def disk_changed(self, path: str, deleted: bool) -> None:
        """A file changed on disk, as the client or our watcher saw it: the index hears it once.
        A root's ``.draftline.toml`` re-resolves the configuration (and what it changes follows)."""
        if not self.disk_changes.is_new(path, deleted):
            return
        if os.path.basename(path) == WORKSPACE_FILE and Path(path).parent in self.roots:
            log.info("%s changed: configuration re-read", path)
            self.configure()
        if self._overlaid_path(path):
            return  # the editor's unsaved text stays what the index serves: its save or close reads the disk
        if deleted:
            self.index.remove(path)
        else:
            self.index.touch(path, None)

    def _overlaid_path(self, path: str) -> bool:
        # compared as the index names them: a buffer opened by a symlinked root's other name is this file
        key = os.path.abspath(self.index.key(path))
        return any(os.path.abspath(self.index.key(uri_to_path(uri) or "")) == key for uri in self._overlaid)

    def set_roots(self, params: t.InitializeParams) -> None:
        folders = params.workspace_folders or []
        uris = [f.uri for f in folders] or [u for u in (params.root_uri,) if u]
        self.roots = new_roots((uri_to_path(u) for u in uris), [])
        if not self.roots and params.root_path:
            self.roots = [Path(params.root_path)]

    # -- status ----------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        tel, sched = self.telemetry, self.scheduler.stats
        engine_info: dict[str, Any] = {"state": self.slot.state, "target": model_label(self.config.model),
                                       "error": self.slot.error}
        engine = self.slot.completer.engine if self.slot.completer is not None else None
        if callable(getattr(engine, "status", None)):  # remote: its state, failures, fallbacks; routes: the models
            what = "routing" if getattr(engine, "routes", None) is not None else "remote"
            try:
                engine_info[what] = engine.status()
            except Exception as exc:
                engine_info[what] = {"state": "error", "error": str(exc)}
        return {
            "engine": engine_info,
            "requests": tel.requests,
            "answered": tel.answered,
            "empty": tel.empty,
            "cancellations": sched.cancelled,
            "engine_cancelled": tel.engine_cancelled,
            "superseded": sched.superseded,
            "stale": tel.stale,
            "errors": tel.errors,
            "cache_hits": tel.cache_hits,
            "type_through": tel.type_through,
            "latency_ms": tel.latency(),
            "prompt_cache": {**tel.prompt_cache(), **_slots_status(engine)},
            "generations": {
                "started": sched.started, "in_flight": sched.in_flight, "max_in_flight": sched.max_in_flight,
            },
            # whose engine thread cancellations, superseded and generations count: a daemon's is every session's
            "scheduler_scope": "daemon" if self.shared is not None else "session",
            "shown": tel.shown,
            "accepted": tel.accepted,
            "partially_accepted": tel.partially_accepted,
            "accepted_chars": tel.accepted_chars,
            "acceptance_rate": tel.acceptance(),
            "index": self.index.stats(),
            "memory": {"rss_mb": round(rss_mb(), 1)},
            "monitor": self.monitor.status() if self.monitor is not None else
            {"enabled": self.config.monitor.enabled, "state": "idle", "degraded": []},
            "documents": len(self.ls.workspace.text_documents) if self.ls.protocol._workspace else 0,
            "roots": [str(r) for r in self.roots],
            "last_chunks": self.last_chunks,
        }


def new_roots(paths: Any, roots: Sequence[Path]) -> list[Path]:
    """The folders of ``paths`` (None: not a file URI) that are not among ``roots`` yet, each once: a
    folder given twice, with or without its trailing '/', is one root (indexed once)."""
    known = {os.path.normpath(r) for r in roots}
    out: list[Path] = []
    for path in paths:
        if path and (norm := os.path.normpath(path)) not in known:
            known.add(norm)
            out.append(Path(norm))
    return out


def _slots_status(engine: Any) -> dict[str, Any]:
    """The local engine's prompt slots (engine.slots): copies kept now, made and put back so far."""
    stats = getattr(getattr(engine, "slots", None), "stats", None)
    return {"slots": stats()} if callable(stats) else {}


def _engine_runner(scheduler: Scheduler):
    """Runs the monitor's model work (dropping KV caches, its plain self-check) on the engine thread,
    queued behind what runs there; called from the event loop."""
    pending: set[asyncio.Future] = set()

    def run(fn) -> None:
        future = asyncio.ensure_future(scheduler.call(fn))
        pending.add(future)
        future.add_done_callback(pending.discard)

    return run


def _index_needs_rebuild(old: IndexSettings, new: IndexSettings) -> bool:
    """Whether an [index] change needs the index reopened (the overlay delay is read where it is used)."""
    return dataclasses.replace(old, overlay_delay_ms=new.overlay_delay_ms) != new


class DiskChanges:
    """Changes on disk reported twice (the client's file watcher and ours) pass once.

    A change is known by the file's state after it (size, mtime, inode; None once deleted): a report
    that finds the file as the last passed one left it is the other watcher's copy of that change.
    A directory's removal is the removal of everything under it, and a directory made again is only
    reported as its files: those states are compared against what happened to their directories too.
    """

    _BACK = "back"  # a removed directory that files were reported in since: a new removal is no copy
    MAX_SEEN = 8192  # paths remembered (every path a week's file events named, build outputs too, was kept)

    def __init__(self) -> None:
        self._seen: dict[str, tuple[Any, int]] = {}  # path -> (its state, the number of that change)
        self._count = 0

    def is_new(self, path: str, deleted: bool) -> bool:
        key = os.path.abspath(path)
        state = None if deleted else _file_state(key)
        parents = _parents(key)
        last = self._seen.get(key)
        # a directory removed after this state was seen took the file out of the index: a rename back
        # in keeps its size, mtime and inode, and is still a change
        if last is not None and last[0] == state and not any(self._removed_since(p, last[1]) for p in parents):
            return False
        self._count += 1
        self._seen.pop(key, None)  # to the end: the oldest change is the first to go past MAX_SEEN
        self._seen[key] = (state, self._count)
        while len(self._seen) > self.MAX_SEEN:
            # a forgotten change lets its copy from the other watcher through: one more index touch. A
            # directory's removal is newer than the states it voids, so it outlives them
            self._seen.pop(next(iter(self._seen)))
        if state is not None:
            for parent in parents:  # it exists again: its next removal is a new one
                seen = self._seen.get(parent)
                if seen is not None and seen[0] is None:
                    self._seen[parent] = (self._BACK, seen[1])
        return True

    def _removed_since(self, directory: str, count: int) -> bool:
        seen = self._seen.get(directory)
        return seen is not None and seen[0] in (None, self._BACK) and seen[1] > count

    def clear(self) -> None:
        self._seen.clear()


def _parents(path: str) -> list[str]:
    parents = []
    while (parent := os.path.dirname(path)) != path:
        parents.append(parent)
        path = parent
    return parents


def _file_state(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns, st.st_ino


@dataclass(frozen=True)
class WatchSink:
    """The watcher's changes (from its thread) handed to the loop, where the client's arrive too."""

    loop: asyncio.AbstractEventLoop
    changed: Any  # (path, deleted) -> None, run on the loop

    def touch(self, path: str) -> None:
        self._post(path, False)

    def remove(self, path: str) -> None:
        self._post(path, True)

    def _post(self, path: str, deleted: bool) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is gone: the server is exiting
            self.loop.call_soon_threadsafe(self.changed, os.fsdecode(path), deleted)


class ConfigWatch:
    """The roots' own ``.draftline.toml``, watched on their top level only (one watch a root, never a
    walk of the tree below). An edit reaches ``changed(path, deleted)`` on the loop once the file has been
    quiet for ``DEBOUNCE_S`` (an editor's save may truncate it first: that empty file is no config).
    """

    DEBOUNCE_S = 0.15  # the index watcher's default (indexer.config debounce_s)
    _EVENTS = {"created", "modified", "closed", "deleted", "moved"}  # not "opened": reading it is no change

    def __init__(self, roots: tuple[Path, ...], loop: asyncio.AbstractEventLoop, changed: Any) -> None:
        self.roots, self._loop, self._changed = roots, loop, changed
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._observer: Any = None

    @classmethod
    def start(cls, roots: tuple[Path, ...], loop: asyncio.AbstractEventLoop, changed: Any) -> ConfigWatch | None:
        """A started watch (None without roots); a root it cannot watch is logged and left to the
        client's file events."""
        if not roots:
            return None
        from watchdog.events import FileSystemEventHandler
        from watchdog.observers import Observer

        watch = cls(roots, loop, changed)

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event: Any) -> None:  # on the observer's thread
                if event.event_type in cls._EVENTS and not event.is_directory:
                    for path in (event.src_path, getattr(event, "dest_path", "")):
                        if path and os.path.basename(os.fsdecode(path)) == WORKSPACE_FILE:
                            with contextlib.suppress(RuntimeError):  # the loop is gone: the server is exiting
                                loop.call_soon_threadsafe(watch._heard, os.fsdecode(path))

        observer = Observer()
        observer.start()  # first: a root scheduled then that cannot be watched fails alone
        for root in roots:
            try:
                observer.schedule(Handler(), str(root), recursive=False)
            except Exception as exc:  # a root that is gone, the inotify limit
                log.warning("not watching %s: %s", Path(root) / WORKSPACE_FILE, exc)
        watch._observer = observer
        return watch

    def _heard(self, path: str) -> None:
        if (timer := self._timers.pop(path, None)) is not None:
            timer.cancel()
        self._timers[path] = self._loop.call_later(self.DEBOUNCE_S, self._settled, path)

    def _settled(self, path: str) -> None:
        self._timers.pop(path, None)
        self._changed(path, not os.path.exists(path))

    def stop(self) -> None:
        """Stop watching; the observer is joined on a thread of its own (not holding up the loop)."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        observer, self._observer = self._observer, None
        if observer is not None:
            observer.stop()
            threading.Thread(target=observer.join, args=(5,), name="draftline-watch-stop", daemon=True).start()


async def in_daemon_thread(fn: Any, *args: Any) -> None:
    """Run ``fn`` on a daemon thread (a long indexing run must not keep an exiting server alive)."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def work() -> None:
        try:
            fn(*args)
        finally:
            with contextlib.suppress(RuntimeError):  # the loop may be gone at exit
                loop.call_soon_threadsafe(lambda: done.done() or done.set_result(None))

    threading.Thread(target=work, name="draftline-index-build", daemon=True).start()
    await done


class IndexProgress:
    """``$/progress`` for the initial indexing, fed from the indexer's thread."""

    def __init__(self, ls: LanguageServer, loop: asyncio.AbstractEventLoop):
        self.ls, self.loop, self.token, self.ok, self.last = ls, loop, str(uuid.uuid4()), False, -1

    async def start(self) -> None:
        try:
            await self.ls.work_done_progress.create_async(self.token)
        except Exception:
            log.warning("client refused a progress token")
            return
        self.ok = True
        self.ls.work_done_progress.begin(self.token, t.WorkDoneProgressBegin(title="draftline: indexing", percentage=0))

    def report(self, done: int, total: int, message: str = "") -> None:
        percent = int(100 * done / total) if total else 100
        if self.ok and percent != self.last:
            self.last = percent
            value = t.WorkDoneProgressReport(message=f"{done}/{total} files", percentage=percent)
            self.loop.call_soon_threadsafe(self.ls.work_done_progress.report, self.token, value)

    def end(self) -> None:
        if self.ok:
            self.ls.work_done_progress.end(self.token, t.WorkDoneProgressEnd(message="indexed"))


def _field(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def build_server(user_config: Path | None = None, shared: Any = None) -> LanguageServer:
    """The composition root of the LSP side: a server with every handler registered (``shared``: a
    session of `draftline serve --tcp`, lsp_server.daemon)."""
    # notebooks (Jupyter in VS Code): every cell is synced, and a cell's completion sees the notebook's
    # other code cells (documents.in_notebook)
    notebooks = t.NotebookDocumentSyncOptions(notebook_selector=[t.NotebookDocumentFilterWithNotebook(notebook="*")])
    ls = DraftlineServer("draftline", "0.1.0", protocol_cls=DraftlineProtocol, notebook_document_sync=notebooks)
    app = Draftline(ls, user_config, shared)
    ls.draftline = app

    @ls.feature(t.INITIALIZE)
    def initialize(params: t.InitializeParams) -> None:
        use_lsp_lines(ls.workspace)  # created just before; no document is open yet
        app.set_roots(params)
        app.init_options = params.initialization_options
        app.configure()

    @ls.feature(t.INITIALIZED)
    def initialized(params: t.InitializedParams) -> None:
        caps = ls.client_capabilities.workspace
        watched = caps and caps.did_change_watched_files
        if watched and watched.dynamic_registration:
            options = t.DidChangeWatchedFilesRegistrationOptions(watchers=[t.FileSystemWatcher(glob_pattern="**/*")])
            method = t.WORKSPACE_DID_CHANGE_WATCHED_FILES
            reg = t.Registration(id=str(uuid.uuid4()), method=method, register_options=options)
            ls.client_register_capability(t.RegistrationParams(registrations=[reg]))
        asyncio.ensure_future(app.start_index())

    @ls.feature(t.TEXT_DOCUMENT_INLINE_COMPLETION, t.InlineCompletionOptions())
    async def inline_completion(params: t.InlineCompletionParams) -> t.InlineCompletionList:
        selected = params.context.selected_completion_info
        invoked = params.context.trigger_kind == t.InlineCompletionTriggerKind.Invoked
        found = await app.suggest(params.text_document.uri, params.position, selected, invoked)
        doc = app.document(params.text_document.uri)
        if found is None or doc is None:
            return t.InlineCompletionList(items=[])
        at = params.position if selected else cursor(found[0], params.position.line, doc)  # past the end: the end
        return t.InlineCompletionList(items=[inline_item(found[0], at, found[1], selected)])

    @ls.feature(t.TEXT_DOCUMENT_COMPLETION)
    async def completion(params: t.CompletionParams) -> t.CompletionList:
        if not app.wants_fallback():
            return t.CompletionList(is_incomplete=False, items=[])
        # LSP's Invoked covers Ctrl+Space (and a client's typing of an identifier): answered inside a word
        invoked = params.context is not None and params.context.trigger_kind == t.CompletionTriggerKind.Invoked
        found = await app.suggest(params.text_document.uri, params.position, invoked=invoked)
        doc = app.document(params.text_document.uri)
        if found is None or doc is None:
            return t.CompletionList(is_incomplete=True, items=[])
        return t.CompletionList(is_incomplete=True, items=[completion_item(doc, found[0], params.position, found[1])])

    @ls.feature(t.TEXT_DOCUMENT_DID_OPEN)
    def did_open(params: t.DidOpenTextDocumentParams) -> None:
        app.edited(params.text_document.uri, params.text_document.text)

    @ls.feature(t.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(params: t.DidChangeTextDocumentParams) -> None:
        doc = app.document(params.text_document.uri)
        app.edited(params.text_document.uri, doc.source if doc is not None else None, immediate=False)

    @ls.feature(t.TEXT_DOCUMENT_DID_SAVE)
    def did_save(params: t.DidSaveTextDocumentParams) -> None:
        app.index_touch(params.text_document.uri, None)

    @ls.feature(t.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(params: t.DidCloseTextDocumentParams) -> None:
        app.scheduler.cancel(app.job_key(params.text_document.uri))
        app.cache.forget(params.text_document.uri)
        app.index_touch(params.text_document.uri, None)  # back to the on-disk text

    def notebook_cells(uri: str) -> list[str]:
        notebook = ls.workspace.get_notebook_document(notebook_uri=uri)
        return [cell.document for cell in notebook.cells] if notebook is not None else []

    # an open notebook's unsaved cells are indexed as an unsaved buffer's text is (the notebook's path)
    @ls.feature(t.NOTEBOOK_DOCUMENT_DID_OPEN)
    def notebook_did_open(params: t.DidOpenNotebookDocumentParams) -> None:
        app.edited(params.notebook_document.uri, app.buffer_text(params.notebook_document.uri))

    @ls.feature(t.NOTEBOOK_DOCUMENT_DID_SAVE)
    def notebook_did_save(params: t.DidSaveNotebookDocumentParams) -> None:
        app.index_touch(params.notebook_document.uri, None)

    @ls.feature(t.NOTEBOOK_DOCUMENT_DID_CHANGE)
    def notebook_did_change(params: t.DidChangeNotebookDocumentParams) -> None:
        # any cell's edit changes every cell's context: what runs for the notebook stops
        cells = notebook_cells(params.notebook_document.uri)
        structure = params.change.cells.structure if params.change.cells else None
        removed = [d.uri for d in structure.did_close or []] if structure else []  # cells deleted
        for cell in {*cells, *removed}:
            app.scheduler.cancel(app.job_key(cell))
        for cell in removed:
            app.cache.forget(cell)
        # re-indexed once typing pauses (with no pause configured, now: its text then, not the disk's)
        now = app.config.index.overlay_delay_ms <= 0
        app.edited(params.notebook_document.uri, app.buffer_text(params.notebook_document.uri) if now else None,
                   immediate=False)

    @ls.feature(t.NOTEBOOK_DOCUMENT_DID_CLOSE)
    def notebook_did_close(params: t.DidCloseNotebookDocumentParams) -> None:
        for cell in params.cell_text_documents:
            app.scheduler.cancel(app.job_key(cell.uri))
            app.cache.forget(cell.uri)
        app.index_touch(params.notebook_document.uri, None)  # back to the file on disk

    @ls.feature(t.WORKSPACE_DID_CHANGE_WATCHED_FILES)
    def did_change_watched_files(params: t.DidChangeWatchedFilesParams) -> None:
        for event in params.changes:
            app.file_event(event)

    @ls.feature(t.WORKSPACE_DID_CHANGE_CONFIGURATION)
    def did_change_configuration(params: t.DidChangeConfigurationParams) -> None:
        app.configure(params.settings)

    @ls.feature(t.WORKSPACE_DID_CHANGE_WORKSPACE_FOLDERS)
    def did_change_workspace_folders(params: t.DidChangeWorkspaceFoldersParams) -> None:
        # normalised on both sides: a folder URI may end in '/', a root (a Path) never does
        removed = {os.path.normpath(p) for p in (uri_to_path(f.uri) for f in params.event.removed) if p}
        app.roots[:] = [r for r in app.roots if os.path.normpath(r) not in removed]  # in place: the completer shares it
        app.roots += new_roots((uri_to_path(f.uri) for f in params.event.added), app.roots)
        app.configure()  # the workspace TOML layer follows the roots
        asyncio.ensure_future(app.reindex())

    @ls.feature(DID_SHOW)
    def did_show(params: Any) -> None:
        app.telemetry.shown += 1

    @ls.feature(DID_PARTIALLY_ACCEPT)
    def did_partially_accept(params: Any) -> None:
        app.telemetry.partially_accepted += 1
        length = _field(params, "acceptedLength", 0)
        app.telemetry.accepted_chars += length if isinstance(length, int) else 0

    @ls.command(ACCEPT_COMMAND)
    def did_accept(*args) -> None:  # no annotation: pygls would try to structure it
        app.telemetry.accepted += 1

    @ls.feature(STATUS)
    def status(params: Any) -> dict[str, Any]:
        return app.status()

    @ls.feature(t.SHUTDOWN)
    def shutdown(params: Any) -> None:
        app.close()

    return ls


def tcp_address(value: str) -> tuple[str, int]:
    """``--tcp``'s HOST:PORT as (host, port): an empty host is loopback, an IPv6 host may come in
    brackets (``[::1]:7333``); ValueError saying what is wrong otherwise."""
    host, sep, port = value.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()):
        raise ValueError(f"--tcp wants HOST:PORT (e.g. 127.0.0.1:7333), not {value!r}")
    if not 0 <= int(port) <= 65535:
        raise ValueError(f"--tcp {value}: the port must be between 0 and 65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or "127.0.0.1", int(port)


def run_serve(args: Any) -> int:
    """``draftline serve``: stdio by default, ``--tcp HOST:PORT`` to listen instead."""
    if not getattr(args, "verbose", False):
        logging.getLogger("pygls").setLevel(logging.WARNING)  # it logs every message at INFO
        logging.getLogger("httpx").setLevel(logging.WARNING)  # and httpx every remote request: a line a keystroke
    if getattr(args, "stdio", False) and args.tcp:
        print("draftline serve: --stdio and --tcp exclude each other", file=sys.stderr)
        return 2
    if getattr(args, "metrics_port", None) is not None:
        try:
            metrics.start_metrics(args.metrics_port)
        except (RuntimeError, OSError) as exc:
            print(f"draftline serve: {exc}", file=sys.stderr)
            return 2
    if args.tcp:  # one daemon, several editors: each connection its own session (lsp_server/daemon.py)
        from lsp_server.daemon import ListenError, serve_sessions

        try:  # a clear line and 2, not a traceback (as for --metrics-port)
            host, port = tcp_address(args.tcp)
        except ValueError as exc:
            print(f"draftline serve: {exc}", file=sys.stderr)
            return 2
        try:
            asyncio.run(serve_sessions(host, port, getattr(args, "config", None)))
        except ListenError as exc:
            print(f"draftline serve: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            pass
        return 0
    ls = build_server(getattr(args, "config", None))
    ls.start_io()
    code = 0 if ls.protocol._shutdown else 1  # LSP: `exit` without `shutdown` (or the client gone) is 1
    # `exit` ends the process now: the interpreter's own exit would wait for the engine thread's prefill
    # or a first start's model conversion in flight (5-8 s measured, a minute for a conversion); the
    # session is closed and nothing of it is left to write
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(ValueError, OSError):  # the writer closed stdout at `exit`
            stream.flush()
    os._exit(code)
