"""lsp_server/metrics.py: the Prometheus text of draftline/status, and the loopback endpoint."""

from __future__ import annotations

import httpx
import pytest

prometheus_client = pytest.importorskip("prometheus_client")

from lsp_server import metrics  # noqa: E402
from lsp_server.metrics import StatusCollector, start_metrics  # noqa: E402

STATUS = {
    "engine": {"state": "ready"}, "requests": 12, "answered": 9, "stale": 0, "errors": 1, "shown": 7,
    "accepted": 3, "acceptance_rate": 0.333, "latency_ms": {"count": 9, "p50": 41.5, "p99": 310.0},
    "memory": {"rss_mb": 812.4},
    "monitor": {"state": "degraded", "degraded": ["latency"], "qps": 0.25},
}


def text(statuses) -> str:
    registry = prometheus_client.CollectorRegistry()
    registry.register(StatusCollector(lambda: statuses))
    return prometheus_client.generate_latest(registry).decode()


def test_status_becomes_metrics_per_session_with_degraded_rules():
    out = text([("1", STATUS), ("2", {**STATUS, "requests": 5, "engine": {"state": "loading"}, "monitor": {}})])
    assert 'draftline_requests_total{session="1"} 12.0' in out
    assert 'draftline_requests_total{session="2"} 5.0' in out
    assert 'draftline_latency_p99_ms{session="1"} 310.0' in out
    assert 'draftline_engine_ready{session="1"} 1.0' in out and 'draftline_engine_ready{session="2"} 0.0' in out
    assert 'draftline_monitor_degraded{rule="latency",session="1"} 1.0' in out
    assert 'draftline_monitor_degraded{rule="acceptance",session="1"} 0.0' in out
    assert 'draftline_qps{session="1"} 0.25' in out
    assert 'draftline_qps{session="2"}' not in out  # no monitor yet: no number rather than a made-up 0
    # what Telemetry.acceptance divides by: shown when the client reports it
    assert "# HELP draftline_acceptance_rate accepted / shown; accepted / answered while" in out


def test_a_session_whose_status_fails_is_skipped_not_the_scrape():
    class Broken:
        def status(self):
            raise RuntimeError("dictionary changed size during iteration")

    class Fine:
        def status(self):
            return STATUS

    broken, fine = Broken(), Fine()
    a, b = metrics.track(broken), metrics.track(fine)
    got = dict(metrics.live_statuses())
    assert str(b) in got and str(a) not in got
    del fine
    assert str(b) not in dict(metrics.live_statuses())  # a closed session leaves with its object


def test_endpoint_serves_on_loopback():
    server, _ = start_metrics(0, statuses=lambda: [("1", STATUS)])
    try:
        assert server.server_address[0] == "127.0.0.1"
        reply = httpx.get(f"http://127.0.0.1:{server.server_port}/metrics", timeout=10)
        assert reply.status_code == 200 and 'draftline_accepted_total{session="1"} 3.0' in reply.text
    finally:
        server.shutdown()
