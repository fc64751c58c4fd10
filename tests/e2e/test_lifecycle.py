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


def run(messages: list[dict | bytes], pause_before: dict[int, float] | None = None, options: dict = OPTIONS,
        timeout: float = 60, initialize: bool = True) -> tuple[int, list[dict], bytes]:
    """Start `draftline serve`, write ``messages`` (waiting ``pause_before[i]`` s before message i; bytes
    are written as they are), after `initialize` and `initialized` unless told not to, and wait for it
    to end; (exit code, its replies, its stderr)."""
    proc = subprocess.Popen([sys.executable, "-m", "lsp_server", "serve"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=server_env())
    init = {"id": 0, "method": "initialize", "params": {"processId": None, "capabilities": {},
                                                         "initializationOptions": options}}
    opening = [init, {"method": "initialized", "params": {}}] if initialize else []
    read: list[dict] = []
    for i, message in enumerate([*opening, *messages]):
        time.sleep((pause_before or {}).get(i - len(opening), 0.0))
        if isinstance(message, dict) and "wait_for" in message:  # read the replies up to this one's
            while not any(r.get("id") == message["wait_for"] and "method" not in r for r in read):
                read.append(read_frame(proc.stdout))
            continue
        proc.stdin.write(message if isinstance(message, bytes) else frame(message))
        proc.stdin.flush()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return proc.returncode, read + replies(out), err


def read_frame(stream) -> dict:
    length = 0
    while (line := stream.readline()) not in (b"\r\n", b""):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return json.loads(stream.read(length))


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
    assert b"Traceback" not in err, err[-2000:]  # nor one: the cancelled generation's reply is not sent after exit


def test_an_exit_does_not_wait_for_the_engine_thread():
    """A step the engine cannot interrupt (a prefill chunk, a first start's model conversion: here a
    fake step of 120 s) does not hold the process after `exit`: it waited for the engine thread."""
    slow = {"draftline": {**OPTIONS["draftline"], "model": {"target": "fake", "options": {"step_s": 120}}}}
    doc = {"textDocument": {"uri": "file:///x.py", "languageId": "python", "version": 1, "text": "x = 1\n"}}
    ask = {"id": 5, "method": "textDocument/inlineCompletion", "params": {
        "textDocument": {"uri": "file:///x.py"}, "position": {"line": 1, "character": 0},
        "context": {"triggerKind": 2}}}
    rc, got, _ = run([{"method": "textDocument/didOpen", "params": doc}, ask, {"id": 6, "method": "shutdown"},
                      {"method": "exit"}], pause_before={1: 2.0, 2: 1.0}, options=slow, timeout=60)
    assert rc == 0 and any(r.get("id") == 6 for r in got)


DOC = {"textDocument": {"uri": "file:///x.py", "languageId": "python", "version": 1, "text": "value = 1\n"}}
ASK = {"method": "textDocument/inlineCompletion", "params": {
    "textDocument": {"uri": "file:///x.py"}, "position": {"line": 0, "character": 8}, "context": {"triggerKind": 1}}}
INIT = {"method": "initialize", "params": {"processId": None, "capabilities": {},
                                           "initializationOptions": {"draftline": {"model": {"target": "fake"}}}}}


def by_id(got: list[dict]) -> dict:
    return {r.get("id"): r for r in got if "method" not in r}


def test_before_initialize_requests_get_32002_and_notifications_are_dropped():
    """LSP: before `initialize` a request is answered -32002 and a notification dropped (a didOpen there
    started loading the default model, and a completion answered with a traceback)."""
    rc, got, _ = run([{"id": 1, **ASK}, {"method": "textDocument/didOpen", "params": DOC}, {"id": 2, **INIT},
                      {"method": "initialized", "params": {}}, {"id": 3, **ASK}, {"wait_for": 3},
                      {"id": 4, "method": "shutdown"}, {"method": "exit"}], initialize=False)
    replies = by_id(got)
    assert replies[1]["error"]["code"] == -32002
    assert "capabilities" in replies[2]["result"]
    assert replies[3]["result"]["items"] == []  # the didOpen before initialize was dropped: an unknown document
    assert rc == 0


def test_a_second_initialize_is_refused_and_changes_nothing():
    rc, got, _ = run([{"method": "textDocument/didOpen", "params": DOC}, {"id": 1, **INIT}, {"id": 2, **ASK},
                      {"wait_for": 2}, {"id": 3, "method": "shutdown"}, {"method": "exit"}])
    replies = by_id(got)
    assert replies[1]["error"]["code"] == -32600
    assert replies[2]["result"]["items"][0]["insertText"]  # the document is still open (it was forgotten)
    assert rc == 0


def test_malformed_messages_get_json_rpc_errors_and_no_popups():
    """A body that is not JSON: -32700 with id null; an id that is an object: -32600 with id null; a
    request without params is read as params null (JSON-RPC allows it); notifications that do not parse
    are logged, not shown to the user (window/showMessage "Error in server: Invalid Params")."""
    body = b"{not json"
    bad_notes = [{"method": "textDocument/didOpen", "params": {"textDocument": {"uri": "file:///y.py"}}},
                 {"method": "$/cancelRequest", "params": None},
                 {"method": "workspace/didChangeWatchedFiles",
                  "params": {"changes": [{"uri": "file:///z", "type": 9}]}},
                 {"method": "textDocument/didShowCompletion"}]
    rc, got, _ = run([b"Content-Length: %d\r\n\r\n" % len(body) + body,
                      {"id": {"x": 1}, "method": "draftline/status"}, *bad_notes,
                      {"id": 1, "method": "draftline/status"}, {"method": "textDocument/didOpen", "params": DOC},
                      {"id": 2, **ASK}, {"wait_for": 2}, {"id": 3, "method": "shutdown"}, {"method": "exit"}])
    errors = [r["error"]["code"] for r in got if "error" in r and r.get("id", "absent") is None]
    assert sorted(errors) == [-32700, -32600]
    assert not [r for r in got if r.get("method") == "window/showMessage"]
    replies = by_id(got)
    assert replies[1]["result"]["engine"]["target"] == "fake"
    assert replies[2]["result"]["items"]
    assert rc == 0
