"""A Prometheus text endpoint for a team box (issue 21): `draftline serve --metrics-port N`.

It serves, on loopback only, what `draftline/status` says of every live session (a stdio server has
one; a `--tcp` daemon one per editor connection, labelled by `session`): requests, answers,
acceptance, latency, memory, QPS and the monitor's rules (1 = degraded). prometheus-client is an
optional dependency (`pip install 'draftline[metrics]'`); the server imports it only when asked.

The numbers are read from the sessions' status() on the scrape thread; a session whose status
cannot be read at that moment is skipped for that scrape rather than failing it.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any, Callable, Iterable

log = logging.getLogger(__name__)

_LIVE: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()  # session number -> object with status()
_NEXT = [0]

RULES = ("latency", "acceptance", "memory", "identical")


def track(session: Any) -> int:
    """Remember a live session (anything with status() -> the draftline/status dict); its number."""
    _NEXT[0] += 1
    _LIVE[_NEXT[0]] = session
    return _NEXT[0]


def untrack(number: int) -> None:
    """Forget a session that ended (its close()): it may live on until a full GC (reference cycles),
    and would be exported as live meanwhile."""
    _LIVE.pop(number, None)


def live_statuses() -> list[tuple[str, dict]]:
    out = []
    for number, session in list(_LIVE.items()):
        try:
            out.append((str(number), session.status()))
        except Exception as exc:  # a status read racing the event loop: skip it this scrape
            log.debug("metrics: session %s status unreadable: %s", number, exc)
    return out


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class StatusCollector:
    """A prometheus_client collector over `statuses()` -> [(session label, draftline/status dict)]."""

    def __init__(self, statuses: Callable[[], Iterable[tuple[str, dict]]] = live_statuses):
        self.statuses = statuses

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        counters = {
            "requests": "completion requests received",
            "answered": "completion requests answered with text",
            "stale": "answers computed for a document version that had moved on",
            "errors": "completion requests that failed",
            "shown": "suggestions the editor reported shown",
            "accepted": "suggestions accepted",
        }
        families = {key: CounterMetricFamily(f"draftline_{key}", doc, labels=["session"]) for key, doc in counters.items()}
        gauges = {
            "acceptance_rate": GaugeMetricFamily(  # as status' acceptance_rate (Telemetry.acceptance) computes it
                "draftline_acceptance_rate", "accepted / shown; accepted / answered while the client reports none shown",
                labels=["session"]),
            "latency_p50": GaugeMetricFamily("draftline_latency_p50_ms", "completion latency p50 (ms)", labels=["session"]),
            "latency_p99": GaugeMetricFamily("draftline_latency_p99_ms", "completion latency p99 (ms)", labels=["session"]),
            "rss": GaugeMetricFamily("draftline_memory_rss_mb", "server resident memory (MB)", labels=["session"]),
            "qps": GaugeMetricFamily("draftline_qps", "completions per second over the monitor's window", labels=["session"]),
            "ready": GaugeMetricFamily("draftline_engine_ready", "1 when the engine is loaded and serving", labels=["session"]),
            "degraded": GaugeMetricFamily("draftline_monitor_degraded", "1 when the monitor rule is in its degraded state",
                                          labels=["session", "rule"]),
        }
        for session, status in self.statuses():
            for key, family in families.items():
                value = _num(status.get(key))
                if value is not None:
                    family.add_metric([session], value)
            latency = status.get("latency_ms") or {}
            monitor = status.get("monitor") or {}
            for key, value in (("acceptance_rate", status.get("acceptance_rate")), ("latency_p50", latency.get("p50")),
                               ("latency_p99", latency.get("p99")), ("rss", (status.get("memory") or {}).get("rss_mb")),
                               ("qps", monitor.get("qps"))):
                if (number := _num(value)) is not None:
                    gauges[key].add_metric([session], number)
            gauges["ready"].add_metric([session], 1.0 if (status.get("engine") or {}).get("state") == "ready" else 0.0)
            degraded = set(monitor.get("degraded") or [])
            for rule in RULES:
                gauges["degraded"].add_metric([session, rule], 1.0 if rule in degraded else 0.0)
        yield from families.values()
        yield from gauges.values()


def start_metrics(port: int, host: str = "127.0.0.1", statuses: Callable[[], Iterable[tuple[str, dict]]] = live_statuses):
    """Serve /metrics on host:port in a daemon thread; (server, thread). Loopback unless told otherwise.
    RuntimeError with the install line when prometheus-client is missing."""
    try:
        from prometheus_client import CollectorRegistry, start_http_server
    except ImportError as exc:
        raise RuntimeError("--metrics-port needs prometheus-client: pip install 'draftline[metrics]'") from exc
    registry = CollectorRegistry()
    registry.register(StatusCollector(statuses))
    server, thread = start_http_server(port, addr=host, registry=registry)
    log.info("metrics on http://%s:%d/metrics", host, server.server_port)
    return server, thread
