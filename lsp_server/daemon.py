"""``draftline serve --tcp``: one daemon, several editors — each connection its own LSP session.

A session is a whole `Draftline` (its roots, documents, configuration, suggestion cache and
telemetry) behind its own pygls protocol and writer, so a second editor never takes over the first
one's pipe and one disconnect ends only that session. What is expensive is shared (`Shared`):

- one engine thread (`Scheduler`): jobs from every session queue on it first come, first served,
  and each session's keys are its own, so one editor's keystroke never cancels another's request;
- the loaded engines, one per model configuration, loaded once on that thread;
- the workspace indexes, one per set of roots and index settings, opened by the first session
  that needs it and closed when the last one lets go (two sessions on one folder share one index
  instead of fighting over its files).

An ``exit`` from a client closes its connection and its session, never the daemon. The daemon listens
on loopback unless told otherwise.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import threading
from collections.abc import Sequence
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
        self._engines: dict[str, asyncio.Future] = {}
        self._ids = itertools.count(1)
        self.sessions = 0

    def session_id(self) -> str:
        return f"s{next(self._ids)}"

    async def engine(self, model: ModelConfig) -> Any:
        """The engine for ``model``, loaded once on the engine thread; a failed load is retried next time."""
        key = repr(model)
        future = self._engines.get(key)
        if future is None:
            future = asyncio.ensure_future(self.scheduler.call(lambda: make_engine(model)))
            self._engines[key] = future
        try:
            return await asyncio.shield(future)
        except Exception:
            if self._engines.get(key) is future:
                del self._engines[key]
            raise

    def close(self) -> None:
        self.scheduler.close()


async def serve_sessions(host: str, port: int, user_config: Path | None = None,
                         ready: asyncio.Future | None = None) -> None:
    """Listen on ``host:port``; every connection is a session of its own until it disconnects."""
    from pygls.io_ import run_async

    from lsp_server.server import build_server

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
            if not writer.is_closing():
                writer.close()
            log.info("session closed (%d open)", shared.sessions)

    server = await asyncio.start_server(session, host, port)
    addrs = ", ".join(str(sock.getsockname()) for sock in server.sockets)
    log.info("draftline listening on %s", addrs)
    if ready is not None and not ready.done():
        ready.set_result(server.sockets[0].getsockname()[1])
    try:
        async with server:
            await server.serve_forever()
    finally:
        shared.close()
