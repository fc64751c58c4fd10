"""A small OpenAI-compatible /v1/completions server on 127.0.0.1 that streams SSE and misbehaves on request.

Used by the tests and by ``draftline bench lsp --storm`` (hence here, not under tests/).

``mode`` picks what the next requests get: ok (stream ``chunks``, then a finish reason and [DONE]),
stall_headers (accept, never answer), stall (headers and ``stall_after`` chunks, then silence), drop
(headers and one chunk, then the socket is closed mid-body), garbage (a 200 whose body is not SSE),
bad_json (a data line that is not JSON), error500, flaky (every tenth request is a 500, the rest ok),
json (a non-streamed JSON answer), storm (see below). With ``gate``
set, each chunk waits for a permit first, so a test decides exactly when tokens go out. Before each
chunk the server looks for a client disconnect, as vLLM and llama-server do, and stops generating.

``storm``: each request fails with probability ``fail_rate`` (seeded: ``seed``), the failure drawn
from ``storm_failures`` (500, a stall before the headers, a stall mid-stream, a dropped connection,
garbage, bad JSON; a stall lasts until the client leaves); the others are answered with
``tag_for(line)``, ``line`` being the cursor line's text before the cursor as the prompt carries it,
so whoever shows the answer can tell which document state it was computed for. ``served`` counts
what each request got.
"""

from __future__ import annotations

import json
import random
import select
import socket
import threading
import time
import zlib
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address):  # a client that hung up mid-answer is a test case
        import sys

        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


STORM_FAILURES = ("error500", "stall_headers", "stall", "drop", "garbage", "bad_json")
FIM_PREFIX, FIM_SUFFIX = "<|fim_prefix|>", "<|fim_suffix|>"  # the Qwen2.5-Coder template (bench --storm's)


TAG_HEAD = 6  # a stalled storm answer sends this much of the tag (a timeout keeps it), then nothing


def tag_for(line: str) -> str:
    """The storm's answer for a cursor whose line reads ``line`` before it: a comment naming that text."""
    return "#@%08x" % zlib.crc32(line.encode("utf-8"))


def computed_for(suggestion: str, line: str) -> bool:
    """Was a storm answer shown at a cursor whose line reads ``line`` computed for that text? Either for
    exactly it (the whole tag, or its head when a stall ran into the timeout), or for an earlier state of
    the line whose suggestion the user has typed into since (type-through shows the rest)."""
    if not suggestion:
        return False
    for k in range(len(line), -1, -1):  # k: how much of the line the answer's request saw
        whole = line[k:] + suggestion
        if len(whole) >= TAG_HEAD and tag_for(line[:k]).startswith(whole):
            return True
    return False


def cursor_line(body: dict) -> str:
    """The cursor line's text before the cursor, read from a request body (FIM tokens in the prompt, or not)."""
    prompt = str(body.get("prompt", ""))
    if FIM_SUFFIX in prompt:
        prompt = prompt.rsplit(FIM_SUFFIX, 1)[0]
        prompt = prompt.rsplit(FIM_PREFIX, 1)[-1]
    return prompt.rsplit("\n", 1)[-1]


class SSEServer:
    def __init__(self, chunks: list[str] | None = None, mode: str = "ok", fail_rate: float = 0.1, seed: int = 0):
        self.chunks = chunks if chunks is not None else ["return", " a", " +", " b"]
        self.mode = mode
        self.finish = "stop"
        self.stall_after = 0
        self.gate: threading.Semaphore | None = None
        self.release = threading.Event()  # ends every stall (teardown)
        self.requests: list[dict] = []  # {"headers": ..., "body": ...}
        self.connections = 0
        self.sent = 0  # chunks written, over all requests
        self.delay_s = 0.0  # before each chunk: the time a token takes (bench remote-cancel's tests)
        self.active = 0  # requests being answered (GET /metrics, as llama-server's --metrics names them)
        self.sent_at_cancel: int | None = None  # tests set this to `sent` when they cancel
        self.disconnects = threading.Event()  # a client went away mid-stream and the server saw it
        self.chunk_sent = threading.Condition()
        self.fail_rate = fail_rate  # storm: the share of requests that fail
        self.storm_failures: tuple[str, ...] = STORM_FAILURES
        self.served: Counter[str] = Counter()  # storm: ok / each failure -> requests
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._httpd = _QuietServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> "SSEServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        if self.gate is not None:
            self.gate.release(1000)
        self._httpd.shutdown()
        self._httpd.server_close()

    def wait_sent(self, n: int, timeout: float = 10.0) -> None:
        with self.chunk_sent:
            if not self.chunk_sent.wait_for(lambda: self.sent >= n, timeout):
                raise AssertionError(f"the server sent {self.sent} chunks, not {n}")

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, chunked bodies

            def setup(self):
                super().setup()
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as real servers do
                server.connections += 1

            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                server.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                with server._lock:
                    server.active += 1
                try:
                    getattr(self, "mode_" + server.mode)(body)
                finally:
                    with server._lock:
                        server.active -= 1

            def do_GET(self):  # /metrics: chunks sent so far and requests in progress, in llama-server's names
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                payload = (f"llamacpp:tokens_predicted_total {server.sent}\n"
                           f"llamacpp:requests_processing {server.active}\n").encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            # -- behaviours --------------------------------------------------------------------
            def mode_ok(self, body):
                self.stream(server.chunks)

            def mode_flaky(self, body):  # every tenth request fails
                (self.mode_error500 if len(server.requests) % 10 == 0 else self.mode_ok)(body)

            def mode_storm(self, body):
                with server._lock:
                    fails = server._rng.random() < server.fail_rate
                    kind = server._rng.choice(server.storm_failures) if fails else "ok"
                    server.served[kind] += 1
                tag = tag_for(cursor_line(body))
                if kind == "ok":
                    self.stream([tag[:TAG_HEAD], tag[TAG_HEAD:8], tag[8:]])
                elif kind == "stall_headers":
                    self.stall_until_gone()
                elif kind == "stall":  # on a timeout the client keeps what came: the tag's head
                    self.start_sse()
                    self.send_event({"choices": [{"index": 0, "text": tag[:TAG_HEAD], "finish_reason": None}]})
                    self.stall_until_gone()
                else:
                    getattr(self, "mode_" + kind)(body)

            def stall_until_gone(self):
                """Silence until the client hangs up (or teardown): a server stuck past any timeout."""
                end = time.monotonic() + 60
                while not server.release.wait(0.02) and time.monotonic() < end:
                    if self.client_gone():
                        server.disconnects.set()
                        return

            def stream(self, chunks):
                self.start_sse()
                for text in chunks:
                    if not self.send_event({"choices": [{"index": 0, "text": text, "finish_reason": None}]}):
                        return
                self.send_event({"choices": [{"index": 0, "text": "", "finish_reason": server.finish}]})
                self.send_event({"choices": [], "usage": {"prompt_tokens": 42, "completion_tokens": len(chunks)}})
                self.send_raw(b"data: [DONE]\n\n")
                self.end_chunks()

            def mode_stall_headers(self, body):
                server.release.wait(30)

            def mode_stall(self, body):
                self.start_sse()
                for text in server.chunks[: server.stall_after]:
                    self.send_event({"choices": [{"index": 0, "text": text, "finish_reason": None}]})
                server.release.wait(30)

            def mode_drop(self, body):
                self.start_sse()
                self.send_event({"choices": [{"index": 0, "text": server.chunks[0], "finish_reason": None}]})
                self.connection.shutdown(socket.SHUT_RDWR)  # no terminating chunk: the body is cut

            def mode_garbage(self, body):
                self.start_sse()
                self.send_raw(b"<html>this is not an event stream</html>\n\n")
                self.end_chunks()

            def mode_bad_json(self, body):
                self.start_sse()
                self.send_raw(b"data: {\"choices\": [{\"text\": \n\n")
                self.end_chunks()

            def mode_error500(self, body):
                payload = b'{"error": {"message": "model overloaded"}}'
                self.send_response(500)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def mode_json(self, body):
                payload = json.dumps({"choices": [{"text": "".join(server.chunks), "finish_reason": "stop"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            # -- wire ----------------------------------------------------------------------------
            def start_sse(self):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.flush()

            def client_gone(self) -> bool:
                readable, _, _ = select.select([self.connection], [], [], 0)
                try:
                    return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
                except OSError:
                    return True

            def send_event(self, event) -> bool:
                """One token; False once the client has gone (the server stops generating)."""
                if server.gate is not None and not server.gate.acquire(timeout=30):
                    return False
                if server.delay_s:
                    time.sleep(server.delay_s)  # the token's forward
                if self.client_gone():
                    server.disconnects.set()
                    return False
                try:
                    self.send_raw(b"data: " + json.dumps(event).encode() + b"\n\n")
                except OSError:
                    server.disconnects.set()
                    return False
                with server.chunk_sent:
                    server.sent += 1
                    server.chunk_sent.notify_all()
                return True

            def send_raw(self, data: bytes):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            def end_chunks(self):
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

        return Handler
