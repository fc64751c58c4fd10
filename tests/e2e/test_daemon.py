"""`draftline serve --tcp`: one daemon, several editors, each connection its own session."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys

import pytest


class RawClient:
    """A minimal LSP client over TCP (Content-Length framing), enough to drive a session."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self.ids = 0
        self.pending: dict[int, asyncio.Future] = {}
        self.pump = asyncio.ensure_future(self._read())

    @classmethod
    async def connect(cls, port: int) -> "RawClient":
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    def send(self, message: dict) -> None:
        body = json.dumps({"jsonrpc": "2.0", **message}).encode()
        self.writer.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)

    async def request(self, method: str, params: dict) -> dict:
        self.ids += 1
        future = asyncio.get_running_loop().create_future()
        self.pending[self.ids] = future
        self.send({"id": self.ids, "method": method, "params": params})
        return await asyncio.wait_for(future, 30)

    def notify(self, method: str, params: dict | None = None) -> None:
        self.send({"method": method, "params": params})

    async def _read(self) -> None:
        while True:
            header = await self.reader.readuntil(b"\r\n\r\n")
            length = int(re.search(rb"Content-Length: (\d+)", header).group(1))
            message = json.loads(await self.reader.readexactly(length))
            if "id" in message and message["id"] in self.pending and "method" not in message:
                self.pending.pop(message["id"]).set_result(message)
            elif "id" in message and "method" in message:  # a server request (registrations): accept
                self.send({"id": message["id"], "result": None})

    async def start(self, root: str, text: str, step_s: float = 0.0, index: dict | None = None) -> None:
        options = {"draftline": {"model": {"target": "fake", "options": {"text": text, "step_s": step_s}},
                                 "index": index or {"enabled": False}, "completion": {"debounce_ms": 0}}}
        await self.request("initialize", {"processId": None, "rootUri": f"file://{root}", "capabilities": {},
                                          "initializationOptions": options})
        self.notify("initialized", {})
        for _ in range(200):
            status = (await self.request("draftline/status", {}))["result"]
            if status["engine"]["state"] == "ready":
                return
            await asyncio.sleep(0.05)
        raise AssertionError("the session's engine never became ready")

    async def status_until(self, predicate, deadline_s: float = 30.0) -> dict:
        """``draftline/status`` polled until ``predicate`` holds (AssertionError with the last one if never)."""
        end = asyncio.get_running_loop().time() + deadline_s
        while True:
            current = (await self.request("draftline/status", {}))["result"]
            if predicate(current):
                return current
            if asyncio.get_running_loop().time() > end:
                raise AssertionError(f"status never matched: {current}")
            await asyncio.sleep(0.05)

    async def complete(self, uri: str, text: str) -> list[str]:
        self.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1,
                                                              "text": text}})
        line = text.count("\n")
        col = len(text.rsplit("\n", 1)[-1])
        reply = await self.request("textDocument/inlineCompletion", {
            "textDocument": {"uri": uri}, "position": {"line": line, "character": col},
            "context": {"triggerKind": 2}})
        return [item["insertText"] for item in reply["result"]["items"]]

    async def close(self, polite: bool = True) -> None:
        if polite:
            await self.request("shutdown", None)
            self.notify("exit")
        await asyncio.sleep(0.1)
        self.pump.cancel()
        self.writer.close()


@pytest.fixture
def daemon():
    proc = subprocess.Popen([sys.executable, "-m", "lsp_server", "serve", "--tcp", "127.0.0.1:0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    port = None
    for line in proc.stderr:  # the daemon logs where it listens
        m = re.search(r"listening on \('127\.0\.0\.1', (\d+)\)", line)
        if m:
            port = int(m.group(1))
            break
    assert port, "the daemon did not report its port"
    yield proc, port
    proc.terminate()
    proc.wait(10)


async def test_two_editors_each_get_their_own_answers_and_one_can_leave(daemon, tmp_path):
    proc, port = daemon
    a, b = await RawClient.connect(port), await RawClient.connect(port)
    await a.start(str(tmp_path), " + from_a", step_s=0.02)
    await b.start(str(tmp_path), " + from_b", step_s=0.02)
    uri = (tmp_path / "same.py").as_uri()  # the same document in both editors: neither cancels the other
    got_a, got_b = await asyncio.gather(a.complete(uri, "x = y"), b.complete(uri, "x = y"))
    assert got_a == [" + from_a"] and got_b == [" + from_b"]
    await a.close()  # shutdown + exit: this session ends, the daemon does not
    assert await b.complete((tmp_path / "other.py").as_uri(), "z = w") == [" + from_b"]
    await b.close(polite=False)  # a dropped connection ends only its session too
    c = await RawClient.connect(port)
    await c.start(str(tmp_path), " + from_c")
    assert await c.complete(uri, "x = y") == [" + from_c"]
    await c.close()
    assert proc.poll() is None  # still serving


async def test_a_session_leaving_politely_keeps_the_shared_index_open_for_the_others(daemon, tmp_path):
    """Both sessions share one index; the one that shuts down (shutdown, exit, then its connection
    closes) lets go of it once, so the other still indexes and retrieves."""
    proc, port = daemon
    root = tmp_path / "ws"
    root.mkdir()
    (root / "helpers.py").write_text("def compute_checksum(data):\n    return sum(data) % 256\n")
    index = {"options": {"embedder": "none", "cache_dir": str(tmp_path / "cache"), "bm25_df_cutoff": 0}}
    a, b = await RawClient.connect(port), await RawClient.connect(port)
    await a.start(str(root), " + from_a", index=index)
    await b.start(str(root), " + from_b", index=index)
    for client in (a, b):
        await client.status_until(lambda s: s["index"]["state"] == "ready" and s["index"]["files"] == 1)
    await a.close()
    await asyncio.sleep(0.5)  # the daemon has closed A's session (its second close) by now

    extra = root / "billing.py"
    extra.write_text("def compute_invoice_total(lines):\n    return sum(lines)\n")
    b.notify("workspace/didChangeWatchedFiles", {"changes": [{"uri": extra.as_uri(), "type": 1}]})
    await b.status_until(lambda s: s["index"]["files"] == 2 and s["index"]["pending"] == 0)
    uri = (root / "main.py").as_uri()
    assert await b.complete(uri, "def invoice(lines):\n    return compute_invoice_total") == [" + from_b"]
    status = (await b.request("draftline/status", {}))["result"]
    assert any(c.startswith("billing.py:") for c in status["last_chunks"]), status["last_chunks"]
    await b.close()
    assert proc.poll() is None


async def test_a_dropped_session_takes_its_unsaved_buffers_out_of_the_shared_index(daemon, tmp_path):
    """An editor that disconnects without didClose leaves no buffer text behind in the shared index:
    the other session retrieves the file as it is on disk again."""
    proc, port = daemon
    root = tmp_path / "ws"
    root.mkdir()
    main = root / "main.py"
    main.write_text("def checksum_of(payload):\n    pass\n")
    index = {"options": {"embedder": "none", "cache_dir": str(tmp_path / "cache"), "bm25_df_cutoff": 0}}
    a, b = await RawClient.connect(port), await RawClient.connect(port)
    await a.start(str(root), " + from_a", index=index)
    await b.start(str(root), " + from_b", index=index)
    ready = lambda s: s["index"]["state"] == "ready" and s["index"]["pending"] == 0  # noqa: E731
    await a.status_until(ready)
    on_disk = (await b.status_until(ready))["index"]["chars"]
    unsaved = main.read_text() + "\n\ndef typed_in_a_only(value):\n    return value * 3\n"
    a.notify("textDocument/didOpen", {"textDocument": {"uri": main.as_uri(), "languageId": "python", "version": 1,
                                                       "text": unsaved}})
    await b.status_until(lambda s: ready(s) and s["index"]["chars"] > on_disk)  # B sees A's buffer
    await a.close(polite=False)
    await b.status_until(lambda s: ready(s) and s["index"]["chars"] == on_disk)  # and then the disk again
    await b.close()
    assert proc.poll() is None
