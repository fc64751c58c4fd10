"""RemoteEngine.complete(request, cancel): an OpenAI-compatible /v1/completions server, streamed.

The seam is Engine's: same request, same result, same stop rules (engine.stops._StopRules, fed the
streamed text pieces instead of token ids). The prompt is built here, with the model family's FIM
template (engine.prompt), and sent as text: no tokenizer is needed, so the prompt is budgeted in
characters (``prompt_chars``), not tokens. vLLM rejects the OpenAI ``suffix`` parameter for almost
every model and llama.cpp's /v1/completions ignores it, so the FIM tokens are written into the
prompt; ``fim = "suffix"`` sends prefix and suffix apart, for servers that render FIM themselves.

httpx (sync) because the engine thread is a plain thread: a pooled Client keeps connections alive
between requests, and its streamed response hands over SSE lines as they arrive. A keystroke (the
cancel event) or the deadline shuts the stream's socket from a small watcher thread, so a read
blocked on a silent server returns at once; the server sees the disconnect and stops generating.
The watcher learns the socket from the network backend (_WatchedBackend): the first byte a request
writes or reads names its connection, a new one or a reused keep-alive one alike; a new one is named
before its (non-blocking) connect and again before its TLS handshake, so neither outlasts a keystroke.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import logging
import os
import re
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field, fields, replace
from typing import Any, Protocol

import httpcore
import httpx

try:
    from httpcore._backends.sync import SyncStream as _SyncStream  # httpcore's stream over a connected socket
except ImportError:  # another httpcore: its own connect and handshake (a keystroke then cannot end them)
    _SyncStream = None

from engine.prompt import TEMPLATES, FimTemplate, PromptBudget, PromptBuilder
from engine.stops import _StopRules
from engine.types import CompletionRequest, CompletionResult, CompletionStats

log = logging.getLogger(__name__)

WATCH_POLL_S = 0.005  # how often the watcher looks at the cancel event and the deadline
CONNECT_POLL_S = 0.05  # a connect in progress looks at the watcher this often (where a shut socket does not wake it)
PIECE_CHARS = 64  # an answer is cut at max_tokens * this many characters (no real token is longer)
LINGER_S = 0.25  # after the finish reason or [DONE], how long the body's end is waited for (keep-alive)
ERROR_BODY_S, ERROR_BODY_BYTES = 0.5, 4096  # how long and how much of an error body is read for the log
FAILURES = ("timeout", "http", "connection", "protocol")


@dataclass(frozen=True)
class RemoteConfig:
    """``model.remote`` in the configuration."""

    url: str  # the server's base URL (".../v1" or ".../v1/completions" also work)
    model: str = ""  # the served model's name (vLLM needs it; llama-server takes anything)
    api_key_env: str = ""  # the NAME of an environment variable holding the key (sent as Bearer)
    timeout_ms: float = 5000.0  # the whole request, connect to last token; on it: what came, or fallback
    fallback: str = "none"  # none (answer empty) | local (the model.target engine answers)
    allow_insecure: bool = False  # permit http:// to a host that is not loopback
    ca_file: str = ""  # a PEM bundle of the CAs that verify the server (a private CA), instead of the system's
    template: str = "auto"  # a family from engine.prompt.TEMPLATES; auto: from the model name
    fim: str = "template"  # template: FIM tokens in the prompt | suffix: the OpenAI `suffix` parameter
    prompt_chars: int = 12000  # prompt budget in characters (no tokenizer client-side)
    pause_after: int = 3  # consecutive failures after which the server is left alone for pause_s
    pause_s: float = 10.0


def parse_remote(table: Mapping[str, Any]) -> RemoteConfig:
    """A RemoteConfig from the configuration table; anything wrong is a ValueError saying what."""
    if not isinstance(table, Mapping):
        raise ValueError(f"model.remote must be a table, not {table!r}")
    if "api_key" in table:
        raise ValueError("model.remote.api_key is not read: put the key in an environment variable and "
                         "name that variable in model.remote.api_key_env")
    known = {f.name: f for f in fields(RemoteConfig)}
    if unknown := sorted(set(table) - set(known)):
        raise ValueError(f"model.remote: unknown key(s) {', '.join(unknown)}; known: {', '.join(known)}")
    if not isinstance(table.get("url"), str) or not table["url"]:
        raise ValueError("model.remote.url is required (e.g. \"http://127.0.0.1:8000\")")
    defaults = RemoteConfig(url="")
    values: dict[str, Any] = {}
    for name, value in table.items():
        default = getattr(defaults, name)
        ok = isinstance(value, type(default)) or (isinstance(default, float) and isinstance(value, int))
        if not ok or (isinstance(value, bool) and not isinstance(default, bool)):
            raise ValueError(f"model.remote.{name} must be a {type(default).__name__}, not {value!r}")
        values[name] = float(value) if isinstance(default, float) else value
    cfg = RemoteConfig(**values)
    if cfg.fallback not in ("none", "local"):
        raise ValueError(f"model.remote.fallback must be \"none\" or \"local\", not {cfg.fallback!r}")
    if cfg.fim not in ("template", "suffix"):
        raise ValueError(f"model.remote.fim must be \"template\" or \"suffix\", not {cfg.fim!r}")
    if cfg.template not in ("auto", *TEMPLATES):
        raise ValueError(f"model.remote.template must be auto or one of {', '.join(TEMPLATES)}, not {cfg.template!r}")
    if cfg.timeout_ms <= 0 or cfg.prompt_chars < 256:
        raise ValueError("model.remote.timeout_ms must be > 0 and prompt_chars >= 256")
    return cfg


def completions_url(url: str, allow_insecure: bool = False) -> str:
    """The /v1/completions endpoint of a base URL; refuses cleartext to a host that is not loopback."""
    try:
        parsed = httpx.URL(url)
    except Exception as exc:
        raise ValueError(f"model.remote.url {display_url(url)!r} is not a URL") from None  # exc quotes the URL
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"model.remote.url must be http(s)://host[:port][/path], not {display_url(url)!r}")
    if parsed.scheme == "http" and not is_loopback(parsed.host) and not allow_insecure:
        raise ValueError(f"refusing http:// to {parsed.host}: code and API key would travel unencrypted; "
                         "use https, or set model.remote.allow_insecure = true on a network you trust")
    path = parsed.path.rstrip("/")
    if path.endswith("/chat/completions"):  # it takes messages, not the FIM prompt sent here
        raise ValueError(f"model.remote.url {display_url(url)!r} is a chat endpoint; draftline sends completion "
                         "requests (a prompt, not messages): give the server's base URL (e.g. https://host/v1)")
    if not path.endswith("/completions"):
        path += "/completions" if path.endswith("/v1") else "/v1/completions"
    return str(parsed.copy_with(path=path))


def display_url(url: str) -> str:
    """`url` for logs and status: a user:password@ in it shows as ***@ (the request still sends it). Cut at
    the last "@" before any query or fragment, as a password may hold an unescaped "@" or "/"."""
    return re.sub(r"^([a-zA-Z][a-zA-Z0-9+.-]*://)[^?#]*@", r"\1***@", url.strip())


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: not resolved here (one that points at loopback is still refused)


def template_for(cfg: RemoteConfig) -> FimTemplate:
    """The configured family, else the one whose name is in the model's (plain when none is)."""
    if cfg.template != "auto":
        return TEMPLATES[cfg.template]
    name = cfg.model.lower()
    return next((t for family, t in TEMPLATES.items() if family in name and family != "plain"), TEMPLATES["plain"])


class CharTokenizer:
    """What PromptBuilder asks of a tokenizer, with one "token" per character (budgets in characters)."""

    bos_token = None
    eos_token_id = None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def __call__(self, text: str, add_special_tokens: bool = False, return_offsets_mapping: bool = False) -> dict:
        return {"offset_mapping": [(i, i + 1) for i in range(len(text))]}

    def convert_tokens_to_ids(self, token: str) -> int:
        return 0  # a special token counts as one character of the budget

    def get_vocab(self) -> dict[str, int]:
        return {}


class _Pieces:
    """The streamed text pieces posing as token ids, so _StopRules runs on them unchanged.

    The rules decode every prefix of the pieces, one per piece: joined afresh each time, that was
    quadratic in the pieces (a server ignoring max_tokens ran seconds past the timeout). The text is
    joined once, as pieces arrive, and a prefix is a slice of it."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self.chars = 0
        self._ends = [0]  # _ends[n]: where the first n pieces end in the text
        self._text = ""  # the first _joined pieces, joined
        self._joined = 0

    def add(self, piece: str) -> None:
        self.items.append(piece)
        self.chars += len(piece)
        self._ends.append(self.chars)

    def decode(self, ids: list[int]) -> str:
        n = len(ids)
        if not n or ids[0] != 0 or ids[-1] != n - 1 or n > len(self.items):  # not a prefix (the rules ask none)
            return "".join(self.items[i] for i in ids)
        if n > self._joined:
            self._text += "".join(self.items[self._joined:])
            self._joined = len(self.items)
        return self._text if n == self._joined else self._text[: self._ends[n]]

    def ids(self) -> list[int]:
        return list(range(len(self.items)))


class LocalEngine(Protocol):
    def complete(self, request: CompletionRequest, cancel: threading.Event) -> CompletionResult: ...


class _Stale(Exception):
    """The request met a kept-alive connection the server had closed: sent again once (RemoteEngine.complete)."""


class RemoteFailure(Exception):
    """A request that produced no usable answer; ``kind`` is one of FAILURES."""

    def __init__(self, kind: str, detail: str):
        super().__init__(f"{kind}: {detail}")
        self.kind, self.detail = kind, detail


@dataclass
class RemoteStatus:
    """Counters and state shown by ``draftline/status`` (engine.status())."""

    state: str = "unknown"  # unknown (nothing sent yet) | ok | failing | paused
    requests: int = 0
    answered: int = 0
    cancelled: int = 0
    fallbacks: int = 0
    failures: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FAILURES, 0))
    consecutive_failures: int = 0
    last_error: str = ""


class _Watch:
    """Shuts the stream's socket once `cancel` is set or the deadline passes, so a blocked read returns."""

    def __init__(self, cancel: threading.Event, deadline: float):
        self.cancel, self.deadline = cancel, deadline
        self.fired = ""  # "" | cancelled | timeout
        self._sock: socket.socket | None = None
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="draftline-remote-watch", daemon=True)
        self._thread.start()

    def attach(self, sock: socket.socket | None) -> None:
        if sock is self._sock:  # every read and write reports its socket; only a change needs the lock
            return
        with self._lock:
            self._sock = sock
            if self.fired:
                self._shut()

    def stop(self) -> None:
        with self._lock:  # after this the socket may be a pooled connection's next request: never shut it
            self._done.set()

    def _run(self) -> None:
        # waits on the cancel event itself, so a keystroke shuts the socket at once (a poll would add up to
        # WATCH_POLL_S, a third of a streamed token on a fast server); the deadline and stop() are polled
        while not self._done.is_set():
            cancelled = self.cancel.wait(WATCH_POLL_S)
            if cancelled or time.monotonic() >= self.deadline:
                with self._lock:
                    if self._done.is_set():
                        return
                    self.fired = "cancelled" if cancelled else "timeout"
                    self._shut()
                return

    def linger(self, seconds: float) -> None:
        """The request ends within `seconds` at the latest (the answer is complete; the rest is the body's end)."""
        self.deadline = min(self.deadline, time.monotonic() + seconds)

    def _shut(self) -> None:
        if self._sock is not None:
            try:
                # wakes a recv() blocked in another thread, and on Linux a connect() in progress; the plain
                # socket's shutdown on a TLS one, as SSLSocket.shutdown drops its SSL object under a
                # handshake or read running in the engine thread
                socket.socket.shutdown(self._sock, socket.SHUT_RDWR)
            except OSError:
                pass


class _WatchedStream(httpcore.NetworkStream):
    """A connection's stream that names its socket to the current request's watcher on every use."""

    def __init__(self, backend: _WatchedBackend, inner: httpcore.NetworkStream):
        self._backend, self._inner = backend, inner

    def _report(self) -> None:
        if (watch := self._backend.watch) is not None:
            watch.attach(self._inner.get_extra_info("socket"))

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        self._report()
        return self._inner.read(max_bytes, timeout)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._report()
        self._inner.write(buffer, timeout)

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context, server_hostname: str | None = None, timeout: float | None = None) -> _WatchedStream:
        sock = self._inner.get_extra_info("socket")
        if _SyncStream is None or not isinstance(self._inner, _SyncStream) or isinstance(sock, ssl.SSLSocket):
            return _WatchedStream(self._backend, self._inner.start_tls(ssl_context, server_hostname, timeout))
        # httpcore's start_tls handshakes inside wrap_socket, which detaches the plain socket the watcher
        # holds: its shutdown then failed, and a keystroke could not end a stalled handshake. Wrapped
        # first and handshaken after, the watcher holds the TLS socket (the same file) while it runs.
        try:
            sock.settimeout(timeout)
            tls = ssl_context.wrap_socket(sock, server_hostname=server_hostname, do_handshake_on_connect=False)
        except OSError as exc:
            sock.close()
            raise httpcore.ConnectError(str(exc)) from exc
        stream = _WatchedStream(self._backend, _SyncStream(tls))
        stream._report()
        try:
            tls.do_handshake()
        except socket.timeout as exc:
            tls.close()
            raise httpcore.ConnectTimeout(str(exc)) from exc
        except OSError as exc:  # ssl.SSLError (a certificate not verified) is one
            tls.close()
            raise httpcore.ConnectError(str(exc)) from exc
        return stream

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _WatchedBackend(httpcore.NetworkBackend):
    """httpcore's sync backend, its streams reporting to ``watch`` (the request in flight, or None).

    httpcore's trace hook names a socket only when a connection is opened (connect_tcp): a request on a
    reused keep-alive connection, every one after the first, would have no socket to shut before the
    response headers, and a cancel while the server is silent until then would wait for the timeout.
    """

    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()
        self.watch: _Watch | None = None
        self.lookups = _Lookups()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options=None) -> _WatchedStream:
        if _SyncStream is None:
            inner = self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        else:
            try:
                inner = _SyncStream(_connect(host, port, timeout, local_address, socket_options, self.watch,
                                             self.lookups))
            except socket.timeout as exc:
                raise httpcore.ConnectTimeout(str(exc)) from exc
            except OSError as exc:
                raise httpcore.ConnectError(str(exc)) from exc
        stream = _WatchedStream(self, inner)
        stream._report()  # before the TLS handshake, which may stall too
        return stream

    def connect_unix_socket(self, path: str, timeout: float | None = None, socket_options=None) -> _WatchedStream:
        stream = _WatchedStream(self, self._inner.connect_unix_socket(path, timeout, socket_options))
        stream._report()
        return stream

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class _Lookups:
    """socket.getaddrinfo, ended by a keystroke or the deadline: a name is looked up in a thread of its own
    (a resolver that does not answer holds getaddrinfo ~5 s a try, which no socket shut can wake), and
    requests made while it runs wait for that same lookup rather than start one each. An address
    literal needs no resolver and is looked up in place."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[tuple[str, int], Future] = {}  # lookups in flight, one per host and port

    def __call__(self, host: str, port: int, watch: _Watch | None, end: float | None) -> list:
        try:
            ipaddress.ip_address(host.split("%", 1)[0])  # an IPv6 literal may carry a zone (%eth0)
        except ValueError:
            pass
        else:
            return socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
        future = self._start(host, port)
        while True:
            if watch is not None and watch.fired:
                raise OSError(errno.ECANCELED, f"name lookup ended: {watch.fired}")
            left = CONNECT_POLL_S if end is None else min(CONNECT_POLL_S, end - time.monotonic())
            if left <= 0:
                raise socket.timeout("timed out")
            try:
                return future.result(left)
            except FutureTimeout:
                if future.done():  # the lookup's own error (TimeoutError is FutureTimeout since 3.11)
                    raise

    def _start(self, host: str, port: int) -> Future:
        key = (host, port)
        with self._lock:
            future = self._running.get(key)
            if future is not None:
                return future
            future = self._running[key] = Future()

        def run() -> None:
            try:
                future.set_result(socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM))
            except BaseException as exc:  # gaierror included: the caller raises it as before
                future.set_exception(exc)
            finally:
                with self._lock:
                    if self._running.get(key) is future:
                        del self._running[key]

        threading.Thread(target=run, name="draftline-remote-lookup", daemon=True).start()
        return future


def _connect(host: str, port: int, timeout: float | None, local_address: str | None, socket_options,
             watch: _Watch | None, lookups: _Lookups) -> socket.socket:
    """socket.create_connection as httpcore calls it, but the socket is the watcher's before it connects and
    connect() does not block: httpcore's blocked in connect() with no socket to shut, so a keystroke, a
    route's time limit or our deadline could not end a connect to a box that drops SYNs (down, firewalled,
    its accept queue full): it waited for the whole timeout. The name lookup ends the same way (_Lookups)."""
    end = None if timeout is None else time.monotonic() + timeout
    error: OSError | None = None
    for family, kind, proto, _, address in lookups(host, port, watch, end):
        sock = socket.socket(family, kind, proto)
        try:
            for option in socket_options or ():
                sock.setsockopt(*option)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if local_address is not None:
                sock.bind((local_address, 0))
            if watch is not None:
                watch.attach(sock)
            sock.setblocking(False)
            err = sock.connect_ex(address)
            with selectors.DefaultSelector() as selector:
                selector.register(sock, selectors.EVENT_WRITE)
                while err in (errno.EINPROGRESS, errno.EALREADY, errno.EWOULDBLOCK, errno.EINTR):
                    if watch is not None and watch.fired:
                        raise OSError(errno.ECANCELED, f"connect ended: {watch.fired}")
                    left = CONNECT_POLL_S if end is None else min(CONNECT_POLL_S, end - time.monotonic())
                    if left <= 0:
                        raise socket.timeout("timed out")
                    if selector.select(left):  # connected, or failed: SO_ERROR says which
                        err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                raise OSError(err, os.strerror(err))
            sock.setblocking(True)
            return sock
        except OSError as exc:
            sock.close()
            if isinstance(exc, socket.timeout) or (watch is not None and watch.fired):
                raise
            error = exc  # the next address, as create_connection does
    raise error if error is not None else OSError(f"no address for {host}")


class RemoteEngine:
    """Completes on a remote OpenAI-compatible server; one caller thread at a time (the engine thread)."""

    def __init__(self, cfg: RemoteConfig, fallback: LocalEngine | None = None, environ: Mapping[str, str] | None = None):
        self.cfg = cfg
        self.endpoint = completions_url(cfg.url, cfg.allow_insecure)
        self.shown_url = display_url(self.endpoint)  # what logs and status show: no password
        environ = os.environ if environ is None else environ
        headers = {"Accept": "text/event-stream"}
        if cfg.api_key_env:
            # a key file's line end ("\r\n") or a pasted space is not part of the key; sent with it, httpx
            # refused the header with a message quoting it, which went to the log and the status
            key = environ.get(cfg.api_key_env, "").strip()
            if not key:
                raise ValueError(f"model.remote.api_key_env names {cfg.api_key_env}, which is not set in the environment")
            if not all(" " <= c <= "~" for c in key):  # the key itself is never quoted
                raise ValueError(f"model.remote.api_key_env: the value of {cfg.api_key_env} holds a character an HTTP "
                                 "header cannot carry (a control character or non-ASCII); check the variable")
            headers["Authorization"] = f"Bearer {key}"
        if cfg.fallback == "local" and fallback is None:
            raise ValueError("model.remote.fallback = \"local\" needs a local engine")
        self.fallback = fallback
        family = template_for(cfg)
        self.template = replace(family, order="none") if cfg.fim == "suffix" else family
        self.prompts = PromptBuilder(self.template, CharTokenizer(), PromptBudget(total=cfg.prompt_chars))
        # trust_env=False: no proxy variables (loopback must stay loopback) and no credentials from ~/.netrc
        transport = httpx.HTTPTransport(verify=_verify(cfg), trust_env=False,
                                        limits=httpx.Limits(max_keepalive_connections=4, keepalive_expiry=60.0))
        self._backend = _WatchedBackend()
        pool = getattr(transport, "_pool", None)  # httpx has no parameter for httpcore's backend
        if pool is not None and hasattr(pool, "_network_backend"):
            pool._network_backend = self._backend
        else:  # another httpx: sockets are then learned only from response headers (a stall before them waits out the timeout)
            log.warning("remote: this httpx has no connection pool backend to watch; a cancel before the "
                        "response headers waits for the timeout")
        self.client = httpx.Client(headers=headers, trust_env=False, timeout=cfg.timeout_ms / 1e3, transport=transport)
        self.stats = RemoteStatus()
        self._paused_until = 0.0
        self.last_prompt = ""
        self._pieces = _Pieces()  # the current (or last) stream's pieces
        self._chat_warned = False

    # -- the seam ----------------------------------------------------------------------------------
    def complete(self, request: CompletionRequest, cancel: threading.Event) -> CompletionResult:
        if cancel.is_set():
            return CompletionResult("", cancelled=True, stop_reason="cancelled")
        self.stats.requests += 1
        if time.monotonic() < self._paused_until:
            return self._fall_back(request, cancel)
        try:
            try:
                result = self._stream(request, cancel)
            except _Stale:
                result = self._stream(request, cancel, stale=True)  # once more, on a fresh connection
        except RemoteFailure as failure:
            if cancel.is_set():  # a keystroke, not the server's fault
                self.stats.cancelled += 1
                return CompletionResult("", cancelled=True, stop_reason="cancelled")
            self._failed(failure)
            return self._fall_back(request, cancel)
        if result.cancelled:
            self.stats.cancelled += 1
            if not result.stats.target_forwards:  # cancelled before any text: no sign the server is well (typing
                return result  # against a box that never answers, a reset here kept it from ever being paused)
        else:
            self.stats.answered += 1
        if self.stats.consecutive_failures:
            log.info("remote %s answers again after %d failure(s)", self.shown_url, self.stats.consecutive_failures)
        self.stats.state, self.stats.consecutive_failures = "ok", 0
        return result

    @property
    def streamed(self) -> int:
        """Pieces of the current (or last) stream so far; other threads may read it (bench remote-cancel)."""
        return len(self._pieces.items)

    def status(self) -> dict[str, Any]:
        s = self.stats
        return {"backend": "remote", "url": self.shown_url, "model": self.cfg.model, "state": s.state,
                "fallback": self.cfg.fallback, "requests": s.requests, "answered": s.answered,
                "cancelled": s.cancelled, "fallbacks": s.fallbacks, "failures": dict(s.failures),
                "consecutive_failures": s.consecutive_failures, "last_error": s.last_error}

    def last_prompt_text(self) -> str:
        return self.last_prompt

    def count_tokens(self, text: str) -> int:
        """The completer's context budgeting, in this engine's unit: characters."""
        return len(text)

    def snippet_budget(self) -> int:
        b = self.prompts.budget
        return int(b.total * b.snippet_share)

    def close(self) -> None:
        self.client.close()

    # -- one request -------------------------------------------------------------------------------
    def body(self, request: CompletionRequest) -> dict[str, Any]:
        """The JSON body of a request (the prompt budgeted in characters)."""
        prompt = self.prompts.build(request)
        self.last_prompt = prompt.render()
        body: dict[str, Any] = {
            "prompt": self.last_prompt, "max_tokens": request.limits.max_tokens, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True},
        }
        if self.cfg.model:
            body["model"] = self.cfg.model
        if stop := self._stop_strings(request):
            body["stop"] = list(stop)
        if self.cfg.fim == "suffix" and request.suffix:
            budget = self.prompts.budget
            body["suffix"] = self.prompts._fit_lines(request.suffix, int(budget.total * budget.suffix_share), head=True)
        return body

    def _stop_strings(self, request: CompletionRequest) -> tuple[str, ...]:
        return tuple(dict.fromkeys((*request.limits.stop, *self.template.stop)))

    def _stream(self, request: CompletionRequest, cancel: threading.Event, stale: bool = False) -> CompletionResult:
        """``stale``: this is the second try after a closed kept-alive connection (no third)."""
        started = time.perf_counter()
        stats = CompletionStats()
        body = self.body(request)
        pieces = self._pieces = _Pieces()
        max_lines = 1 if request.mode == "single-line" else request.limits.max_lines
        rules = _StopRules(pieces, self._stop_strings(request), max_lines, request.limits.time_budget_s,
                           request.limits.min_indent, closer_words=request.limits.closer_words,
                           lead_indent=request.limits.lead_indent)
        reason, done = "", False
        # a server that ignores max_tokens (or sends megabytes in one piece) is cut here: each piece holds
        # a token or more, and no token is longer than PIECE_CHARS
        max_pieces = max(request.limits.max_tokens, 1)
        max_chars = max_pieces * PIECE_CHARS
        watch = self._backend.watch = _Watch(cancel, time.monotonic() + self.cfg.timeout_ms / 1e3)
        response = None
        try:
            with self.client.stream("POST", self.endpoint, json=body) as response:
                watch.attach(response.extensions["network_stream"].get_extra_info("socket"))  # the same one, normally
                _check_status(response, watch)
                for kind, value in _events(response):
                    if kind == "usage":
                        stats.prompt_tokens = _count(value.get("prompt_tokens"))
                        stats.generated_tokens = _count(value.get("completion_tokens"))
                        details = value.get("prompt_tokens_details")
                        stats.reused_tokens = _count(details.get("cached_tokens")) if isinstance(details, dict) else 0
                        continue
                    if kind in ("finish", "done"):  # the answer is complete (usage and [DONE] may follow)
                        if kind == "finish":
                            reason = {"length": "max_tokens", "stop": "eos"}.get(value, value or "eos")
                        reason, done = reason or "eos", True
                        # the rest is read for the connection's sake (a body left unread closes it), but not
                        # waited for long: a server or proxy that keeps the body open held a complete answer
                        # until the timeout
                        watch.linger(LINGER_S)
                        continue
                    if kind == "chat":
                        if not self._chat_warned:
                            self._chat_warned = True
                            log.warning("remote %s answers in the chat format (choices[].delta.content), not as a "
                                        "completions server; its text is used, but draftline's FIM prompt is written "
                                        "for /v1/completions (check model.remote.url)", self.shown_url)
                        continue
                    if len(pieces.items) >= max_pieces:
                        reason = "max_tokens"  # more pieces than tokens asked for
                        break
                    if not pieces.items:
                        stats.prefill_s = time.perf_counter() - started  # time to the first token
                    pieces.add(value[: max_chars - pieces.chars])
                    if cancel.is_set():
                        reason = "cancelled"
                        break
                    if stop := rules(pieces.ids()):
                        reason = stop  # leaving the block closes the stream: the server stops
                        break
                    if pieces.chars >= max_chars:
                        reason = "max_tokens"
                        break
                    if not done and time.monotonic() >= watch.deadline:
                        # pieces already buffered are read without blocking: the watcher's shut socket does
                        # not end this loop, and the rules' time ran past the timeout
                        reason = "time"
                        break
                else:
                    if not reason:  # neither [DONE] nor a finish reason: the stream was cut short
                        raise RemoteFailure("protocol", f"the stream ended early ({len(pieces.items)} piece(s), no [DONE])")
        except RemoteFailure:
            if not done:
                raise
            # the answer was complete: an odd event after it (or an error event) does not take it back
        except (httpx.HTTPError, OSError) as exc:
            if done:
                pass  # the answer was complete; only the connection's end went wrong
            elif watch.fired == "cancelled" or cancel.is_set():
                reason = "cancelled"
            elif watch.fired == "timeout" or isinstance(exc, httpx.TimeoutException):
                if not pieces.items:
                    raise RemoteFailure("timeout", f"no answer within {self.cfg.timeout_ms:.0f} ms") from None
                reason = "time"  # what arrived in time is kept (the local engine's time budget does the same)
            elif isinstance(exc, httpx.LocalProtocolError):
                # h11's message quotes the header it refused, which may be the Authorization header
                raise RemoteFailure("connection", f"{type(exc).__name__} (a request header could not be sent; "
                                    "its text is not logged)") from None
            elif response is None and not stale and isinstance(
                    exc, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)):
                # a kept-alive connection the server closed as the request went out (its idle timeout, or
                # one answer per connection): "disconnected without sending a response", or a reset when
                # the request reached a closed socket. No answer was begun, so it is sent again
                raise _Stale() from None
            elif not pieces.items or not isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError)):
                raise RemoteFailure("connection", f"{type(exc).__name__}: {exc}") from None
            else:
                raise RemoteFailure("connection", f"the stream broke after {len(pieces.items)} piece(s): {exc}") from None
        finally:
            self._backend.watch = None
            watch.stop()
        if not done and (watch.fired == "cancelled" or cancel.is_set()):
            reason = "cancelled"
        text = rules.cut("".join(pieces.items), reason)  # a server's "length" or our timeout: the rules did not fire
        stats.generated_tokens = stats.generated_tokens or len(pieces.items)
        stats.target_forwards = len(pieces.items)
        stats.total_s = time.perf_counter() - started
        return CompletionResult(text, cancelled=reason == "cancelled", stop_reason=reason or "eos", stats=stats)

    # -- failures ----------------------------------------------------------------------------------
    def _failed(self, failure: RemoteFailure) -> None:
        s = self.stats
        s.failures[failure.kind] += 1
        s.consecutive_failures += 1
        s.last_error = f"{failure.kind}: {failure.detail}"
        then = "answering from the local model" if self.fallback is not None else "answering empty"
        if self.cfg.pause_after and s.consecutive_failures >= self.cfg.pause_after:
            self._paused_until = time.monotonic() + self.cfg.pause_s
            s.state = "paused"
            then += f"; {s.consecutive_failures} failures in a row, not asking it again for {self.cfg.pause_s:g} s"
        else:
            s.state = "failing"
        log.warning("remote %s: %s (%s)", self.shown_url, s.last_error, then)

    def _fall_back(self, request: CompletionRequest, cancel: threading.Event) -> CompletionResult:
        if self.fallback is None:
            return CompletionResult("", stop_reason="error")
        self.stats.fallbacks += 1
        return self.fallback.complete(request, cancel)


def _check_status(response: httpx.Response, watch: _Watch) -> None:
    if response.status_code == 200:
        return
    # the head of the body, read briefly: a proxy's HTML page may be megabytes, and a body that never
    # comes held the request for the whole timeout; its excerpt goes on one log line
    watch.linger(ERROR_BODY_S)
    head = b""
    try:
        for data in response.iter_bytes():
            head += data
            if len(head) >= ERROR_BODY_BYTES:
                break
    except httpx.HTTPError:
        pass
    detail = " ".join(head[:ERROR_BODY_BYTES].decode("utf-8", "replace").split())[:300]
    raise RemoteFailure("http", f"HTTP {response.status_code} {response.reason_phrase}" + (f": {detail}" if detail else ""))


def _count(value: Any) -> int:
    """A usage count as a server wrote it: 0 for anything but a whole number ("n/a", null, a list)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return 0
    try:
        return max(int(value), 0)
    except (ValueError, OverflowError):
        return 0


def _events(response: httpx.Response):
    """("text", piece) | ("finish", reason) | ("usage", dict) | ("done", None) | ("chat", None) (the next
    text came in the chat shape) from an SSE stream (or a plain JSON answer)."""
    if response.headers.get("content-type", "").startswith("application/json"):  # a server that does not stream
        yield from _choice_events(_parse(response.read().decode("utf-8-sig", "replace")))  # -sig: a BOM goes
        yield "done", None
        return
    # An event's data may span several "data:" lines, joined by "\n" and ended by a blank line (SSE; a
    # pretty-printed JSON event was "not JSON"). A line that completes the JSON (every server's one-line
    # events) is read at once, not held until the blank line.
    pending: list[str] = []
    for n, line in enumerate(response.iter_lines()):
        if n == 0:
            line = line.removeprefix("\ufeff")  # a byte order mark before the first field (SSE skips one)
        if not line.strip() and pending:
            data, pending = "\n".join(pending), []
            yield from _choice_events(_parse(data))
            continue
        if not line.startswith("data:"):
            continue  # blank separators, comments (":"), event/id/retry fields: nothing for us
        pending.append(line[5:].strip())
        data = "\n".join(pending)
        if data == "[DONE]":
            pending = []
            yield "done", None
            continue  # read on to the body's end (it follows at once), or the connection cannot be reused
        if (event := _whole_json(data)) is not None:
            pending = []
            yield from _choice_events(_parse(data, event))
    if pending:
        yield from _choice_events(_parse("\n".join(pending)))


def _whole_json(data: str) -> Any:
    """``data`` parsed, or None while it is not (yet) a whole JSON value."""
    try:
        return json.loads(data)
    except ValueError:
        return None


def _parse(data: str, event: Any = None) -> dict:
    """``event``: ``data`` already parsed."""
    if event is None:
        try:
            event = json.loads(data)
        except ValueError:
            raise RemoteFailure("protocol", f"not JSON in the stream: {data[:80]!r}") from None
    if not isinstance(event, dict):
        raise RemoteFailure("protocol", f"unexpected event {data[:80]!r}")
    if event.get("error"):  # "error": null on every event is a server's empty field, not an error
        error = event["error"]
        message = error.get("message", error) if isinstance(error, dict) else error
        raise RemoteFailure("http", f"the server reported: {str(message)[:200]}")
    return event


def _choice_events(event: dict):
    choices = event.get("choices")
    if choices is None and isinstance(event.get("usage"), dict):
        choices = []  # the final usage event without choices, or with choices null (TGI, llama.cpp forks)
    if not isinstance(choices, list):
        raise RemoteFailure("protocol", f"an event without choices: {json.dumps(event)[:80]}")
    for choice in choices[:1]:
        if not isinstance(choice, dict):
            raise RemoteFailure("protocol", f"a choice without text: {json.dumps(choice)[:80]}")
        text = choice.get("text")
        if text is None and isinstance(choice.get("delta"), dict):  # the chat shape: read, and warned of once
            yield "chat", None
            text = choice["delta"].get("content")
        if text is not None and not isinstance(text, str):  # "text": null (with a finish reason) is no text
            raise RemoteFailure("protocol", f"a choice without text: {json.dumps(choice)[:80]}")
        if text:
            yield "text", text
        if choice.get("finish_reason"):
            yield "finish", str(choice["finish_reason"])
    if isinstance(event.get("usage"), dict):
        yield "usage", event["usage"]


def _verify(cfg: RemoteConfig) -> ssl.SSLContext | bool:
    """What verifies the server's certificate: the system's CAs, or ``ca_file``'s (a ValueError if it cannot be read)."""
    if not cfg.ca_file:
        return True
    try:
        return ssl.create_default_context(cafile=os.path.expanduser(cfg.ca_file))
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"model.remote.ca_file {cfg.ca_file!r} cannot be used (a PEM file of CA certificates): "
                         f"{exc.strerror or exc}") from None


def load_remote(table: Mapping[str, Any], fallback: LocalEngine | None = None) -> RemoteEngine:
    """The engine ``model.remote`` describes (ValueError for a bad table, URL or missing key)."""
    return RemoteEngine(parse_remote(table), fallback)
