"""`draftline serve --tcp ... --metrics-port N`: Prometheus text of every live session, on loopback."""

from __future__ import annotations

import re
import socket
import subprocess
import sys

import httpx
import pytest

from tests.e2e.test_daemon import RawClient

pytest.importorskip("prometheus_client")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_metrics_count_each_sessions_requests(tmp_path):
    metrics_port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "lsp_server", "serve", "--tcp", "127.0.0.1:0",
                             "--metrics-port", str(metrics_port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        port = None
        for line in proc.stderr:
            if m := re.search(r"listening on \('127\.0\.0\.1', (\d+)\)", line):
                port = int(m.group(1))
                break
        assert port, "the daemon did not report its port"
        a, b = await RawClient.connect(port), await RawClient.connect(port)
        await a.start(str(tmp_path), " + a")
        await b.start(str(tmp_path), " + b")
        assert await a.complete((tmp_path / "x.py").as_uri(), "x = y") == [" + a"]
        assert await b.complete((tmp_path / "y.py").as_uri(), "z = w") == [" + b"]
        assert await b.complete((tmp_path / "y.py").as_uri(), "z = w\nq = r") == [" + b"]
        async with httpx.AsyncClient() as http:
            body = (await http.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10)).text
        requests = sorted(float(v) for v in re.findall(r'^draftline_requests_total\{session="\d+"\} (\S+)$', body, re.M))
        assert requests == [1.0, 2.0]
        assert len(re.findall(r'^draftline_engine_ready\{session="\d+"\} 1\.0$', body, re.M)) == 2
        assert re.search(r'^draftline_monitor_degraded\{rule="latency",session="\d+"\} 0\.0$', body, re.M)
        await a.close()
        await b.close()
    finally:
        proc.terminate()
        proc.wait(10)
