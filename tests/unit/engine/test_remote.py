"""The remote engine against a misbehaving OpenAI-compatible server on 127.0.0.1 (no network, no sleeps)."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from engine.fake import FakeEngine
from engine.remote import RemoteEngine, completions_url, load_remote, parse_remote, template_for
from engine.types import CompletionRequest, Limits
from engine.sse_server import SSEServer

REQUEST = CompletionRequest(prefix="def add(a, b):\n    ", suffix="\n\nprint(add(1, 2))\n", path="calc.py",
                            mode="multi-line", limits=Limits(max_tokens=32, max_lines=4, min_indent=4))
SLACK_S = 5.0  # an upper bound for "returns promptly" on a loaded 2-core machine (not a sleep)


@pytest.fixture
def server():
    with SSEServer() as srv:
        yield srv


def engine(srv: SSEServer, **remote) -> RemoteEngine:
    return load_remote({"url": srv.url, "model": "qwen2.5-coder-7b", "timeout_ms": 2000, **remote})


def run_in_thread(fn):
    box: dict = {}
    thread = threading.Thread(target=lambda: box.setdefault("result", fn()), daemon=True)
    thread.start()
    return thread, box


def test_streamed_answer_with_the_family_prompt_and_stop_rules(server: SSEServer):
    server.chunks = ["return", " a", " +", " b", "\n", "\n", "print", "(1)", "\n", "x = 2"]
    eng = engine(server)
    result = eng.complete(REQUEST, threading.Event())
    assert result.text == "return a + b\n" and result.stop_reason == "scope"  # `print` left the function
    assert not result.cancelled and result.stats.target_forwards == 7  # closed at the first dedented token
    body = server.requests[0]["body"]
    assert server.requests[0]["path"] == "/v1/completions"
    assert body["stream"] is True and body["model"] == "qwen2.5-coder-7b" and body["temperature"] == 0
    assert body["max_tokens"] == 32 and "<|file_sep|>" in body["stop"] and "suffix" not in body
    assert body["prompt"] == ("<|file_sep|>calc.py\n<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>"
                              "\n\nprint(add(1, 2))\n<|fim_middle|>")
    assert eng.last_prompt_text() == body["prompt"]
    assert eng.count_tokens("abc") == 3 and eng.snippet_budget() == int(12000 * 0.35)  # characters
    assert eng.status()["state"] == "ok" and eng.status()["answered"] == 1


def test_single_line_stops_at_the_newline_and_the_connection_is_kept_for_a_finished_stream(server: SSEServer):
    eng = engine(server)
    single = CompletionRequest(prefix="x = ", mode="single-line", limits=Limits(max_tokens=8))
    server.chunks = ["1", " +", " 2"]
    first = eng.complete(single, threading.Event())
    second = eng.complete(single, threading.Event())
    assert first.text == second.text == "1 + 2" and first.stop_reason == "eos"
    assert first.stats.prompt_tokens == 42 and first.stats.generated_tokens == 3  # from the server's usage
    assert server.connections == 1  # keep-alive
    server.chunks = ["1", "\n", "y = 2"]
    assert eng.complete(single, threading.Event()).text == "1"


def test_cancel_closes_the_stream_and_the_server_stops(server: SSEServer):
    server.chunks = [f" t{i}" for i in range(50)]
    server.gate = threading.Semaphore(0)
    eng, cancel = engine(server, timeout_ms=60_000), threading.Event()
    thread, box = run_in_thread(lambda: eng.complete(REQUEST, cancel))
    server.gate.release(2)
    server.wait_sent(2)
    cancel.set()  # the keystroke; the client is blocked reading a silent stream
    server.sent_at_cancel = server.sent
    thread.join(SLACK_S)
    assert not thread.is_alive() and box["result"].cancelled and box["result"].stop_reason == "cancelled"
    server.gate.release(10)  # the server would go on generating...
    assert server.disconnects.wait(SLACK_S)  # ...but sees the client gone first
    assert server.sent - server.sent_at_cancel <= 1
    assert eng.status()["cancelled"] == 1 and eng.status()["failures"] == dict.fromkeys(
        ("timeout", "http", "connection", "protocol"), 0)


def test_cancel_before_any_header(server: SSEServer):
    server.mode = "stall_headers"
    eng, cancel = engine(server, timeout_ms=60_000), threading.Event()
    thread, box = run_in_thread(lambda: eng.complete(REQUEST, cancel))
    while not server.requests:  # the request is at the server
        thread.join(0.01)
    cancel.set()
    thread.join(SLACK_S)
    assert not thread.is_alive() and box["result"].cancelled


def test_cancel_before_any_header_on_a_reused_connection(server: SSEServer):
    # no connect happens on a kept-alive connection, so its socket must be known from the request's first write
    eng, cancel = engine(server, timeout_ms=20_000), threading.Event()
    assert eng.complete(REQUEST, threading.Event()).text == "return a + b"
    server.mode = "stall_headers"
    thread, box = run_in_thread(lambda: eng.complete(REQUEST, cancel))
    while len(server.requests) < 2:
        thread.join(0.01)
    started = time.monotonic()
    cancel.set()
    thread.join(SLACK_S)
    assert not thread.is_alive() and box["result"].cancelled
    assert time.monotonic() - started < SLACK_S  # the 20 s timeout did not end it
    assert server.connections == 1  # the second request did reuse the first's connection


@pytest.mark.parametrize("stall_after", [0, 2])
def test_a_stalled_server_times_out(server: SSEServer, stall_after: int, caplog):
    server.mode, server.stall_after = "stall", stall_after
    eng = engine(server, timeout_ms=300)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="engine.remote"):
        result = eng.complete(REQUEST, threading.Event())
    assert time.monotonic() - started < 0.3 + SLACK_S
    if stall_after:  # what came in time is kept, as the local time budget keeps it
        assert result.text == "return a" and result.stop_reason == "time"
    else:
        assert result.text == "" and result.stop_reason == "error"
        assert eng.status()["failures"]["timeout"] == 1 and eng.status()["state"] == "failing"
        assert [r.message for r in caplog.records] == [
            f"remote {server.url}/v1/completions: timeout: no answer within 300 ms (answering empty)"]


def test_a_server_that_never_sends_headers_times_out_to_the_fallback(server: SSEServer):
    server.mode = "stall_headers"
    cfg = parse_remote({"url": server.url, "timeout_ms": 300, "fallback": "local"})
    eng = RemoteEngine(cfg, fallback=FakeEngine(text="local answer"))
    started = time.monotonic()
    result = eng.complete(REQUEST, threading.Event())
    assert result.text == "local answer" and time.monotonic() - started < 0.3 + SLACK_S
    assert eng.status()["fallbacks"] == 1 and eng.status()["failures"]["timeout"] == 1


@pytest.mark.parametrize("mode, kind, detail", [
    ("drop", "connection", "the stream broke after 1 piece"),
    ("garbage", "protocol", "the stream ended early"),
    ("bad_json", "protocol", "not JSON in the stream"),
    ("error500", "http", "HTTP 500 Internal Server Error: {\"error\": {\"message\": \"model overloaded\"}}"),
])
def test_failures_fall_back_with_one_log_line(server: SSEServer, mode: str, kind: str, detail: str, caplog):
    server.mode = mode
    local = FakeEngine(text="from the local model")
    eng = RemoteEngine(parse_remote({"url": server.url, "fallback": "local"}), fallback=local)
    with caplog.at_level(logging.WARNING, logger="engine.remote"):
        result = eng.complete(REQUEST, threading.Event())
    assert result.text == "from the local model" and local.calls == 1
    (record,) = caplog.records
    assert f": {kind}: " in record.message and detail in record.message and "answering from the local model" in record.message
    status = eng.status()
    assert status["failures"][kind] == 1 and status["fallbacks"] == 1 and status["last_error"].startswith(kind)


def test_a_failing_server_is_paused_then_asked_again(server: SSEServer):
    server.mode = "error500"
    eng = engine(server, pause_after=2, pause_s=3600)
    for _ in range(3):
        assert eng.complete(REQUEST, threading.Event()).text == ""
    assert len(server.requests) == 2 and eng.status()["state"] == "paused"  # the third never left
    server.mode = "ok"
    eng._paused_until = 0.0  # the pause is over
    assert eng.complete(REQUEST, threading.Event()).text == "return a + b"
    assert eng.status()["state"] == "ok" and eng.status()["consecutive_failures"] == 0


def test_a_non_streaming_json_answer_is_accepted(server: SSEServer):
    server.mode = "json"
    assert engine(server).complete(REQUEST, threading.Event()).text == "return a + b"


def test_api_key_from_the_environment_is_sent_as_bearer(server: SSEServer):
    cfg = parse_remote({"url": server.url, "api_key_env": "DRAFTLINE_TEST_KEY"})
    eng = RemoteEngine(cfg, environ={"DRAFTLINE_TEST_KEY": "s3cret"})
    eng.complete(REQUEST, threading.Event())
    assert server.requests[0]["headers"]["Authorization"] == "Bearer s3cret"
    assert "s3cret" not in repr(eng.status())
    with pytest.raises(ValueError, match="DRAFTLINE_TEST_KEY, which is not set"):
        RemoteEngine(cfg, environ={})
    with pytest.raises(ValueError, match="environment variable"):
        parse_remote({"url": server.url, "api_key": "s3cret"})


@pytest.mark.parametrize("url, ok", [
    ("http://127.0.0.1:8000", True), ("http://localhost:8000/v1", True), ("http://[::1]:8000", True),
    ("https://gpu.example.com", True), ("http://gpu.example.com:8000", False), ("http://10.0.0.5:8000", False),
])
def test_cleartext_only_to_loopback_unless_allowed(url: str, ok: bool):
    if ok:
        assert completions_url(url).endswith("/v1/completions")
    else:
        with pytest.raises(ValueError, match="refusing http://"):
            completions_url(url)
        assert completions_url(url, allow_insecure=True).endswith("/v1/completions")


@pytest.mark.parametrize("table, message", [
    ({"model": "x"}, "url is required"),
    ({"url": "ftp://host"}, "must be http"),
    ({"url": "http://127.0.0.1", "timeout_ms": "fast"}, "timeout_ms must be a float"),
    ({"url": "http://127.0.0.1", "fallback": "cloud"}, "fallback must be"),
    ({"url": "http://127.0.0.1", "colour": "blue"}, "unknown key"),
    ("http://127.0.0.1", "must be a table"),
])
def test_bad_configuration_is_a_clear_error(table, message: str):
    with pytest.raises(ValueError, match=message):
        load_remote(table)


def test_template_from_the_model_name_and_suffix_mode(server: SSEServer):
    assert template_for(parse_remote({"url": "http://127.0.0.1", "model": "bigcode/starcoder2-3b"})).family == "starcoder2"
    assert template_for(parse_remote({"url": "http://127.0.0.1", "model": "my-model"})).family == "plain"
    eng = engine(server, fim="suffix")
    eng.complete(REQUEST, threading.Event())
    body = server.requests[0]["body"]
    assert body["suffix"] == REQUEST.suffix and "<|fim" not in body["prompt"]
    assert body["prompt"].endswith("def add(a, b):\n    ")


def test_make_engine_routes_model_remote(server: SSEServer):
    from lsp_server.engines import make_engine
    from lsp_server.config import ModelConfig

    remote = make_engine(ModelConfig(target="fake", options={"text": "local"}, remote={"url": server.url, "fallback": "local"}))
    assert isinstance(remote, RemoteEngine) and isinstance(remote.fallback, FakeEngine)
    assert isinstance(make_engine(ModelConfig(target="fake", remote={"url": ""})), FakeEngine)  # url "" = off
    with pytest.raises(ValueError, match="refusing http://"):
        make_engine(ModelConfig(target="fake", remote={"url": "http://192.0.2.1"}))


def test_config_layers_merge_remote_but_a_workspace_file_cannot_set_it(tmp_path):
    from lsp_server.config import resolve_config

    user = tmp_path / "user.toml"
    user.write_text('[model.remote]\nurl = "http://127.0.0.1:8000"\napi_key_env = "DRAFTLINE_KEY"\n')
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / ".draftline.toml").write_text('[model.remote]\nurl = "https://attacker.example"\napi_key_env = "AWS_SECRET"\n')
    cfg = resolve_config(user_file=user, workspace_roots=[ws], init_options={"model": {"remote": {"model": "m"}}})
    assert cfg.model.remote == {"url": "http://127.0.0.1:8000", "api_key_env": "DRAFTLINE_KEY", "model": "m"}
