"""The server's lifecycle over stdio, as raw JSON-RPC: exit codes, requests after shutdown, an exit while
a generation runs."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from tests.e2e.conftest import server_env

OPTIONS = {"draftline": {"model": {"target": "fake", "options": {"step_s": 0.3}},
                         "completion": {"debounce_ms": 0, "mode": "multi"}}}


def frame(message: dict) -> bytes:
    body = json.dumps({"jsonrpc": "2.0", **message}).encode()
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


def replies(out: bytes) -> list[dict]:
    found = []
    while b"\r\n\r\n" in out:
        head, rest = out.split(b"\r\n\r\n", 1)
        length = int(head.split(b"Content-Length:")[1].split(b"\r\n")[0])
        found.append(json.loads(rest[:length]))
        out = rest[length:]
    return found


def run(messages: list[dict], pause_before: dict[int, float] | None = None, options: dict = OPTIONS,
        timeout: float = 60) -> tuple[int, list[dict], bytes]:
    """Start `draftline serve`, write ``messages`` (waiting ``pause_before[i]`` s before message i), wait
    for it to end; (exit code, its replies, its stderr)."""
    proc = subprocess.Popen([sys.executable, "-m", "lsp_server", "serve"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=server_env())
    init = {"id": 0, "method": "initialize", "params": {"processId": None, "capabilities": {},
                                                         "initializationOptions": options}}
    for i, message in enumerate([init, {"method": "initialized", "params": {}}, *messages]):
        time.sleep((pause_before or {}).get(i - 2, 0.0))
        proc.stdin.write(frame(message))
        proc.stdin.flush()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return proc.returncode, replies(out), err


STATUS = {"method": "draftline/status", "params": {}}


def test_exit_codes_and_requests_after_shutdown():
    rc, got, _ = run([{"id": 1, "method": "shutdown", "params": None}, {"id": 2, **STATUS}, {"method": "exit"}])
    assert rc == 0
    after = next(r for r in got if r.get("id") == 2)
    assert after["error"]["code"] == -32600  # InvalidRequest: shutting down (it went unanswered)
    rc, _, _ = run([{"method": "exit"}])
    assert rc == 1  # exit without shutdown (it was 0)


def test_an_exit_while_a_generation_runs_ends_quietly():
    doc = {"textDocument": {"uri": "file:///x.py", "languageId": "python", "version": 1, "text": "def f():\n    return a"}}
    ask = {"id": 5, "method": "textDocument/inlineCompletion", "params": {
        "textDocument": {"uri": "file:///x.py"}, "position": {"line": 1, "character": 12}, "context": {"triggerKind": 2}}}
    rc, _, err = run([{"method": "textDocument/didOpen", "params": doc}, ask, {"method": "exit"}],
                     pause_before={1: 2.0, 2: 1.0})  # the model is loaded; the generation has started
    assert rc == 1
    assert len(err) < 100_000, err[-2000:]  # it wrote 9 MB of tracebacks, each failed write reported again


def test_an_exit_does_not_wait_for_the_engine_thread():
    """A step the engine cannot interrupt (a prefill chunk, a first start's model conversion: here a
    fake step of 120 s) does not hold the process after `exit`: it waited for the engine thread."""
    slow = {"draftline": {**OPTIONS["draftline"], "model": {"target": "fake", "options": {"step_s": 120}}}}
    doc = {"textDocument": {"uri": "file:///x.py", "languageId": "python", "version": 1, "text": "x = 1\n"}}
    ask = {"id": 5, "method": "textDocument/inlineCompletion", "params": {
        "textDocument": {"uri": "file:///x.py"}, "position": {"line": 1, "character": 0}, "context": {"triggerKind": 2}}}
    rc, got, _ = run([{"method": "textDocument/didOpen", "params": doc}, ask, {"id": 6, "method": "shutdown"},
                      {"method": "exit"}], pause_before={1: 2.0, 2: 1.0}, options=slow, timeout=60)
    assert rc == 0 and any(r.get("id") == 6 for r in got)
