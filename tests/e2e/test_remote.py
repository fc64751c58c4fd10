"""The real server with ``model.remote``: LSP -> RemoteEngine -> an OpenAI-compatible SSE server on 127.0.0.1."""

from __future__ import annotations

import pytest
from pytest_lsp import LanguageClient

from tests.e2e.lsp_harness import end_of, initialize, inline_params, items, open_doc, status
from engine.sse_server import SSEServer

DOC = "def add(a, b):\n    return a"


@pytest.fixture
def backend():
    with SSEServer(chunks=[" +", " b", "\n", "\n", "print", "(add(1, 2))"]) as srv:
        yield srv


def remote_options(srv: SSEServer, **model) -> dict:
    remote = {"url": srv.url, "model": "Qwen/Qwen2.5-Coder-7B", "timeout_ms": 5000, **model.pop("remote", {})}
    return {"draftline": {"model": {"remote": remote, **model}, "completion": {"debounce_ms": 0}}}


async def test_inline_completion_from_a_remote_server(client: LanguageClient, backend: SSEServer):
    await initialize(client, init_options=remote_options(backend))
    open_doc(client, DOC)
    found = items(await client.text_document_inline_completion_async(inline_params(end_of(DOC))))
    assert [i.insert_text for i in found] == [" + b"]
    body = backend.requests[0]["body"]
    assert body["stream"] is True and body["prompt"].startswith("<|file_sep|>")
    assert body["prompt"].endswith("<|fim_prefix|>" + DOC + "<|fim_suffix|><|fim_middle|>")
    assert (await status(client))["engine"]["state"] == "ready"


async def test_a_failing_remote_falls_back_to_the_local_model(client: LanguageClient, backend: SSEServer):
    backend.mode = "error500"
    options = remote_options(backend, target="fake", options={"text": "local answer"}, remote={"fallback": "local"})
    await initialize(client, init_options=options)
    open_doc(client, DOC)
    found = items(await client.text_document_inline_completion_async(inline_params(end_of(DOC))))
    assert [i.insert_text for i in found] == ["local answer"]
    assert len(backend.requests) == 1
    engine = (await status(client))["engine"]
    assert engine["target"].startswith("remote:")
    assert engine["remote"]["fallbacks"] == 1 and engine["remote"]["failures"]["http"] == 1


async def test_a_refused_url_is_a_load_failure_not_a_crash(client: LanguageClient, backend: SSEServer):
    options = {"draftline": {"model": {"remote": {"url": "http://192.0.2.1:8000"}}}}
    await initialize(client, init_options=options, wait="failed")
    current = await status(client)
    assert "refusing http://" in current["engine"]["error"]
    assert any("refusing http://" in m.message for m in client.messages)


def test_typing_storm_against_a_flaky_server_has_no_stale_answer_and_no_hang(tmp_path, backend: SSEServer):
    """`draftline bench lsp --remote`: every keystroke answered or cancelled, none stale, none timed out."""
    import argparse
    import asyncio
    import sys

    from lsp_server.bench.lsp import bench_settings, pick_lines, run_bench, summarize

    backend.mode = "flaky"
    backend.chunks = ["x", "y", "z"]
    ws = tmp_path / "ws"
    ws.mkdir()
    for i in range(3):
        head = "import os\n\n\ndef g():\n    pass\n\n"  # bench lines come from line 6 on
        (ws / f"m{i}.py").write_text(head + f"def f{i}(value):\n    return value + {i} * compute_something(value)\n")
    tasks = pick_lines(ws, 3, seed=0)
    assert len(tasks) == 3
    args = argparse.Namespace(no_index=True, target=None, draft=None, remote=backend.url, remote_model="qwen2.5-coder",
                              remote_key_env="", debounce_ms=0)
    settings = bench_settings(args, remote=True)
    run = asyncio.run(run_bench(ws, tasks, keys_per_s=80, settings=settings, pause_s=20,
                                server=[sys.executable, "-m", "lsp_server", "serve"]))
    report = summarize(run, 80)
    typed = sum(len(t.text.strip()) for t in tasks)
    assert report["requests"] == typed and report["errors"] == 0 and report["stale_answers"] == 0
    assert report["answered"] + report["cancelled"] == typed and report["max_in_flight"] == 1
    assert len(backend.requests) >= 10  # the remote path was taken, the tenth request failed
