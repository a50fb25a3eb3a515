"""Prometheus metrics of one runtime: every worker writes, the supervisor serves ``/metrics``.

Workers are separate processes that come and go, so the counts live in prometheus_client's
multiprocess mode: each process writes its values to memory-mapped files in one directory that
the supervisor creates, and a scrape sums the files. A counter therefore keeps what a worker
counted after that worker died or was replaced, and any scrape sees the sum over all workers.
The mode is chosen by an environment variable that prometheus_client reads when it is first
imported, so :func:`use_directory` runs in the supervisor before any import of it, and workers
inherit the variable. A handler that defines its own prometheus_client metrics gets them
aggregated and served the same way.

Hot-path cost: a request adds one counter and one histogram observation (a few microseconds of
memory-mapped writes); the in-flight and queued gauges are sampled with the worker's heartbeat,
not written per request.
"""

from __future__ import annotations

import logging
import os
import platform
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from prometheus_client import Counter

__all__ = [
    "CONTENT_TYPE",
    "METRICS_DIR_VARIABLE",
    "ReportedMetrics",
    "SupervisorMetrics",
    "WorkerMetrics",
    "reported_metrics",
    "use_directory",
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


def use_directory(path: str) -> None:
    """Put this process (and the workers it spawns) in multiprocess mode, writing to ``path``.

    Must run before prometheus_client is imported anywhere in the process.
    """
    os.environ[METRICS_DIR_VARIABLE] = path


class WorkerMetrics:
    """What a worker counts: requests by status, their duration, in-flight and queued calls."""

    def __init__(self) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        # registry=None: values go to this process's files; only the supervisor's scrape reads
        # them, and the handler's own default registry stays the handler's.
        self._requests = Counter(
            f"{_PREFIX}_requests",
            "Handler requests answered, by HTTP status code (health checks and scrapes are "
            "not counted).",
            ["code"],
            registry=None,
        )
        self._duration = Histogram(
            f"{_PREFIX}_request_duration_seconds",
            "Seconds from a request's arrival until its response was sent.",
            buckets=_DURATION_BUCKETS,
            registry=None,
        )
        self._timeouts = Counter(
            f"{_PREFIX}_timeouts",
            "Requests answered 504 because the handler did not answer within the timeout.",
            registry=None,
        )
        self._rejected = Counter(
            f"{_PREFIX}_rejected_requests",
            "Requests answered 503 without calling the handler: busy (queue full) or "
            "unavailable (not ready, draining).",
            ["reason"],
            registry=None,
        )
        self._in_flight = Gauge(
            f"{_PREFIX}_in_flight_requests",
            "Handler requests being served now (queued ones included).",
            multiprocess_mode="livesum",
            registry=None,
        )
        self._queued = Gauge(
            f"{_PREFIX}_queued_requests",
            "Handler calls waiting for a free handler slot now.",
            multiprocess_mode="livesum",
            registry=None,
        )
        # labels() looks the child up on every call; the handful of codes are cached here.
        self._by_code: dict[int, Counter] = {}

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

    def sample(self, in_flight: int, queued: int) -> None:
        """The gauges, set with each heartbeat (twice a second)."""
        self._in_flight.set(in_flight)
        self._queued.set(queued)


class SupervisorMetrics:
    """What the supervisor counts (worker restarts, build info) and the scrape of everything."""

    def __init__(self, version: str, handler: str, style: str) -> None:
        from prometheus_client import Counter, Gauge

        self._restarts = Counter(
            f"{_PREFIX}_worker_restarts",
            "Workers replaced after they died (crashed), their handler got stuck past "
            "timeout + grace (stuck), their event loop stopped answering (blocked), they served "
            "--max-requests (max_requests) or grew past --max-worker-memory (memory).",
            ["reason"],
            registry=None,
        )
        for reason in ("crashed", "stuck", "blocked", "max_requests", "memory"):
            self._restarts.labels(reason=reason)  # present at 0 from the first scrape
        info = Gauge(
            f"{_PREFIX}_build_info",
            "Always 1; the labels say which runtime serves which handler.",
            ["version", "python", "handler", "style"],
            multiprocess_mode="max",
            registry=None,
        )
        info.labels(
            version=version,
            python=platform.python_version(),
            handler=handler,
            style=style,
        ).set(1)

    def worker_restarted(self, reason: str) -> None:
        self._restarts.labels(reason=reason).inc()

    @staticmethod
    def worker_gone(pid: int) -> None:
        """Drop a dead worker's live gauges; its counters stay in the sums."""
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]

    @staticmethod
    def render() -> bytes:
        """The Prometheus text exposition of every process's metrics, summed."""
        from prometheus_client import CollectorRegistry, generate_latest, multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return generate_latest(registry)


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
