"""Prometheus metrics: the front counts every request in its own registry; handler processes
write what the handler itself reports to files the front sums.

The front answers every request, so what it counts (requests by status, durations, timeouts,
refusals, in flight and queued, worker restarts) lives in one in-process registry: an
increment is a few hundred nanoseconds and nothing touches the disk. What a handler counts
itself (its own prometheus_client metrics, Seldon's reported metrics) happens in handler
processes that come and go, so they use prometheus_client's multiprocess mode: each writes
memory-mapped files in one directory that the front creates, and a scrape sums them, keeping
what a replaced process counted. The mode is chosen by an environment variable that
prometheus_client reads when first imported; the front sets it for its children only
(:func:`handler_environment`), never for itself.
"""

from __future__ import annotations

import logging
import os
import platform
import threading
from collections.abc import Mapping
from typing import Any, Final

__all__ = [
    "CONTENT_TYPE",
    "METRICS_DIR_VARIABLE",
    "FrontMetrics",
    "ReportedMetrics",
    "handler_environment",
    "reported_metrics",
]

_log = logging.getLogger("abeja_runtime")

METRICS_DIR_VARIABLE: Final = "PROMETHEUS_MULTIPROC_DIR"
CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
_PREFIX: Final = "abeja_runtime"
#: Seconds; from a cache hit (5 ms) to the default 60 s timeout, so that a timeout shows as
#: its own bucket rather than disappearing into +Inf.
_DURATION_BUCKETS: Final = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, float("inf"),
)  # fmt: skip


def handler_environment(directory: str) -> dict[str, str]:
    """The environment of a handler process: this one's, with the metrics directory."""
    return {**os.environ, METRICS_DIR_VARIABLE: directory}


class FrontMetrics:
    """What the front counts, and the scrape of everything."""

    def __init__(self, version: str, handler: str, style: str, directory: str) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self._directory = directory
        self.registry = registry = CollectorRegistry()
        self._requests = Counter(
            f"{_PREFIX}_requests",
            "Handler requests answered, by HTTP status code (health checks and scrapes are "
            "not counted).",
            ["code"],
            registry=registry,
        )
        self._duration = Histogram(
            f"{_PREFIX}_request_duration_seconds",
            "Seconds from a request's arrival until its response was sent.",
            buckets=_DURATION_BUCKETS,
            registry=registry,
        )
        self._timeouts = Counter(
            f"{_PREFIX}_timeouts",
            "Requests answered 504 because the handler did not answer within the timeout.",
            registry=registry,
        )
        self._rejected = Counter(
            f"{_PREFIX}_rejected_requests",
            "Requests answered 503 without calling the handler: busy (queue full) or "
            "unavailable (not ready, draining).",
            ["reason"],
            registry=registry,
        )
        self.in_flight = Gauge(
            f"{_PREFIX}_in_flight_requests",
            "Handler requests being served now (queued ones included).",
            registry=registry,
        )
        self.queued = Gauge(
            f"{_PREFIX}_queued_requests",
            "Handler calls waiting for a free handler slot now.",
            registry=registry,
        )
        self._restarts = Counter(
            f"{_PREFIX}_worker_restarts",
            "Workers replaced after they died (crashed), their handler got stuck past "
            "timeout + grace (stuck), they served --max-requests (max_requests) or grew past "
            "--max-worker-memory (memory).",
            ["reason"],
            registry=registry,
        )
        for reason in ("crashed", "stuck", "max_requests", "memory"):
            self._restarts.labels(reason=reason)  # present at 0 from the first scrape
        info = Gauge(
            f"{_PREFIX}_build_info",
            "Always 1; the labels say which runtime serves which handler.",
            ["version", "python", "handler", "style"],
            registry=registry,
        )
        info.labels(
            version=version, python=platform.python_version(), handler=handler, style=style
        ).set(1)
        # labels() looks the child up on every call; the handful of codes are cached here.
        self._by_code: dict[int, Any] = {}

    def observe(self, status: int, seconds: float) -> None:
        """One answered request."""
        counter = self._by_code.get(status)
        if counter is None:
            counter = self._by_code[status] = self._requests.labels(code=str(status))
        counter.inc()
        self._duration.observe(seconds)
        if status == 504:
            self._timeouts.inc()

    def rejected(self, reason: str) -> None:
        self._rejected.labels(reason=reason).inc()

    def worker_restarted(self, reason: str) -> None:
        self._restarts.labels(reason=reason).inc()

    def worker_gone(self, pid: int) -> None:
        """Drop a dead handler process's live gauges; its counters stay in the sums."""
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid, self._directory)  # type: ignore[no-untyped-call]

    def render(self) -> bytes:
        """The Prometheus text exposition: the front's metrics, then the handlers' summed."""
        from prometheus_client import CollectorRegistry, generate_latest, multiprocess

        handlers = CollectorRegistry()
        multiprocess.MultiProcessCollector(handlers, self._directory)  # type: ignore[no-untyped-call]
        return generate_latest(self.registry) + generate_latest(handlers)


#: Seldon's TIMER buckets, in seconds: 0, then 50 log-spaced bounds from 1 ms to 30 s.
_TIMER_BUCKETS: Final = (0.0, *(0.001 * 30_000 ** (i / 49) for i in range(50)), float("inf"))


class ReportedMetrics:
    """Metrics a handler reports as values (Seldon's ``COUNTER``, ``GAUGE`` and ``TIMER``).

    Each key becomes a metric on first use, with the report's tags as labels: a counter adds
    the value, a gauge is set to it (the most recent report of a live worker wins), a timer
    observes it (milliseconds, as Seldon's) in a histogram with Seldon's buckets. Counters and
    timers are summed over workers rather than labelled by worker as seldon-core does. A
    report that cannot become a metric (an invalid name, a key reused with another type or
    other tags, a negative counter step) is skipped with one warning per key: it must never
    fail the request that carried it.
    """

    def __init__(self) -> None:
        self._metrics: dict[str, tuple[str, tuple[str, ...], Any]] = {}
        self._refused: set[str] = set()
        self._lock = threading.Lock()

    def record(self, kind: str, key: str, value: float, tags: Mapping[str, str]) -> None:
        try:
            metric = self._metric(kind, key, tuple(sorted(tags)))
            child = metric.labels(**{name: str(v) for name, v in tags.items()}) if tags else metric
            if kind == "COUNTER":
                child.inc(value)
            elif kind == "GAUGE":
                child.set(value)
            else:
                child.observe(value / 1000)
        except ValueError as exc:
            self._refuse(key, str(exc))

    def _metric(self, kind: str, key: str, labels: tuple[str, ...]) -> Any:
        with self._lock:
            known = self._metrics.get(key)
            if known is None:
                known = self._metrics[key] = (kind, labels, _new_metric(kind, key, labels))
        if known[:2] != (kind, labels):
            raise ValueError(
                f"it was first reported as a {known[0]} with tags {list(known[1])}, now as a "
                f"{kind} with tags {list(labels)}"
            )
        return known[2]

    def _refuse(self, key: str, why: str) -> None:
        if key not in self._refused:
            self._refused.add(key)
            _log.warning("the handler's metric %r is not exported: %s", key, why)


def _new_metric(kind: str, key: str, labels: tuple[str, ...]) -> Any:
    from prometheus_client import Counter, Gauge, Histogram

    text = f"Reported by the handler ({kind})."
    if kind == "COUNTER":
        return Counter(key, text, labels, registry=None)
    if kind == "GAUGE":
        return Gauge(key, text, labels, multiprocess_mode="livemostrecent", registry=None)
    return Histogram(key, text, labels, buckets=_TIMER_BUCKETS, registry=None)


_reported: ReportedMetrics | None = None
_reported_lock = threading.Lock()


def reported_metrics() -> ReportedMetrics:
    """This worker's one :class:`ReportedMetrics` (style adapters report from handler threads)."""
    global _reported
    with _reported_lock:
        if _reported is None:
            _reported = ReportedMetrics()
        return _reported
