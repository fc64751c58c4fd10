"""``draftline serve --tcp``: one daemon, several editors — each connection its own LSP session.

A session is a whole `Draftline` (its roots, documents, configuration, suggestion cache and
telemetry) behind its own pygls protocol and writer, so a second editor never takes over the first
one's pipe and one disconnect ends only that session. What is expensive is shared (`Shared`):

- one engine thread (`Scheduler`): jobs from every session queue on it first come, first served,
  and each session's keys are its own, so one editor's keystroke never cancels another's request;
- the loaded engines, one per model configuration (its options in any order), loaded once on that
  thread and freed once no session uses it;
- the workspace indexes, one per set of roots and index settings, opened by the first session
  that needs it and closed when the last one lets go (two sessions on one folder share one index
  instead of fighting over its files).

An ``exit`` from a client closes its connection and its session, never the daemon. The daemon listens
on loopback unless told otherwise.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lsp_server.engines import make_engine
from lsp_server.index_handle import open_index
from lsp_server.config import IndexSettings, ModelConfig
from lsp_server.scheduler import Scheduler

log = logging.getLogger(__name__)


class IndexRegistry:
    """Indexes shared between sessions: one per (roots, settings), closed when its last user releases it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[tuple, list[Any]] = {}  # key -> [index, users]
        # id(index) -> path -> {session's handle id: its unsaved text}, the latest last
        self._overlays: dict[int, dict[str, dict[int, str]]] = {}

    def overlay(self, index: Any, path: str, text: str | None, owner: int) -> str | None:
        """What the shared ``index`` should hold for ``path`` after ``owner`` (a session) set its unsaved
        text (``text``) or let go of it (None: closed, saved, or changed on disk): the latest text a
        session still holds, else None (the disk's). One editor leaving a file two of them edit no longer
        puts the disk's text back under the other."""
        key = os.path.abspath(path)
        with self._lock:
            paths = self._overlays.setdefault(id(index), {})
            owners = paths.setdefault(key, {})
            owners.pop(owner, None)
            if text is not None:
                owners[owner] = text
            if not owners:
                del paths[key]
                return None
            return next(reversed(owners.values()))

    @staticmethod
    def _key(roots: Sequence[Path], cfg: IndexSettings) -> tuple:
        """What defines an index: its roots and the indexer's options (in any order). Not the overlay
        delay: each session reads its own where it uses it (server._index_needs_rebuild agrees)."""
        options = json.dumps(dict(cfg.options), sort_keys=True, default=str)
        return tuple(sorted(str(Path(r).resolve()) for r in roots)), cfg.enabled, options

    def acquire(self, roots: Sequence[Path], cfg: IndexSettings) -> Any:
        """The shared index of ``roots`` (opened on first use); None when it cannot open."""
        key = self._key(roots, cfg)
        with self._lock:  # held while opening: a second session waits and then shares it
            entry = self._open.get(key)
            if entry is not None:
                entry[1] += 1
                return entry[0]
            index = open_index(roots, cfg)
            if index is not None:
                self._open[key] = [index, 1]
            return index

    def release(self, index: Any) -> None:
        with self._lock:
            for key, entry in list(self._open.items()):
                if entry[0] is index:
                    entry[1] -= 1
                    if entry[1] > 0:
                        return
                    del self._open[key]
                    self._overlays.pop(id(index), None)
                    break
        if hasattr(index, "close"):
            index.close()

    def users(self) -> dict[str, int]:
        with self._lock:
            return {", ".join(key[0]): entry[1] for key, entry in self._open.items()}


class Shared:
    """What the sessions of one daemon share: the engine thread, the loaded engines, the indexes."""

    def __init__(self) -> None:
        self.scheduler = Scheduler()
        self.indexes = IndexRegistry()
        self._engines: dict[str, list[Any]] = {}  # key -> [its load (a future), users]
        self._ids = itertools.count(1)
        self.sessions = 0

    def session_id(self) -> str:
        return f"s{next(self._ids)}"

    @staticmethod
    def _key(model: ModelConfig) -> str:
        """What defines an engine: its model configuration, whatever order its tables' keys came in
        (a repr kept the order: one model loaded twice for two editors)."""
        fields = {f.name: getattr(model, f.name) for f in dataclasses.fields(model)}
        return json.dumps(_plain(fields), sort_keys=True, default=str)

    async def engine(self, model: ModelConfig) -> Any:
        """The engine for ``model``, loaded once on the engine thread and shared while sessions use it:
        each engine this returns is one more user, for `release_engine` to end. A failed load is
        retried next time."""
        key = self._key(model)
        entry = self._engines.get(key)
        if entry is None:
            entry = self._engines[key] = [asyncio.ensure_future(self.scheduler.call(lambda: make_engine(model))), 0]
        entry[1] += 1
        future = entry[0]
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            self.release_engine(model, future)  # this caller never got it
            raise
        except Exception:
            if self._engines.get(key) is entry:
                del self._engines[key]
            raise

    def release_engine(self, model: ModelConfig, load: Any = None) -> None:
        """A session no longer uses the engine of ``model`` (it switched models or ended); after the
        last user's release the daemon holds it no more, and the model's next use loads it again. A
        generation still running on it holds it (its job, the completer) until it ends: the engine is
        freed then, never under it. ``load``: the load this user waited for (a release that finds
        another one in the table, started since, is not its to make)."""
        key = self._key(model)
        entry = self._engines.get(key)
        if entry is None or (load is not None and entry[0] is not load):
            return
        entry[1] -= 1
        if entry[1] <= 0:
            del self._engines[key]

    def engines(self) -> dict[str, int]:
        """The engines held now: their key and how many users each has."""
        return {key: entry[1] for key, entry in self._engines.items()}

    def close(self) -> None:
        self.scheduler.close()


def _plain(value: Any) -> Any:
    """``value`` with every mapping a dict and every sequence a list (json's own types)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class ListenError(Exception):
    """The daemon could not listen where it was told (``draftline serve`` says so and exits 2)."""


async def serve_sessions(host: str, port: int, user_config: Path | None = None,
                         ready: asyncio.Future | None = None) -> None:
    """Listen on ``host:port``; every connection is a session of its own until it disconnects."""
    from pygls.io_ import run_async

    from lsp_server.server import EngineSlot, build_server

    shared = Shared()

    async def session(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ls = build_server(user_config, shared=shared)
        stop = threading.Event()
        ls.protocol.session_stop = stop  # `exit` ends this session only (DraftlineProtocol.lsp_exit)
        ls.protocol.set_writer(writer)
        shared.sessions += 1
        log.info("session opened (%d open)", shared.sessions)
        try:
            await run_async(stop_event=stop, reader=reader, protocol=ls.protocol, logger=log,
                            error_handler=ls.report_server_error)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            shared.sessions -= 1
            ls.draftline.close()
            # the session's objects wait for the GC (reference cycles): its engine, released, must not
            ls.draftline.slot, ls.draftline.monitor = EngineSlot(), None
            if not writer.is_closing():
                writer.close()
            log.info("session closed (%d open)", shared.sessions)

    try:
        server = await asyncio.start_server(session, host, port)
    except OSError as exc:  # the port is taken, the host unknown or not this machine's
        shared.close()
        reason = os.strerror(exc.errno) if isinstance(exc.errno, int) and exc.errno > 0 else exc.strerror or exc
        raise ListenError(f"cannot listen on {host}:{port}: {reason}") from exc
    addrs = ", ".join(str(sock.getsockname()) for sock in server.sockets)
    log.info("draftline listening on %s", addrs)
    if ready is not None and not ready.done():
        ready.set_result(server.sockets[0].getsockname()[1])
    try:
        async with server:
            await server.serve_forever()
    finally:
        shared.close()
