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

import os
import platform
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from prometheus_client import Counter

__all__ = [
    "CONTENT_TYPE",
    "METRICS_DIR_VARIABLE",
    "SupervisorMetrics",
    "WorkerMetrics",
    "use_directory",
]

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
            "timeout + grace (stuck), or their event loop stopped answering (blocked).",
            ["reason"],
            registry=None,
        )
        for reason in ("crashed", "stuck", "blocked"):
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
