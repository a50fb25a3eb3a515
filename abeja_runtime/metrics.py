"""Prometheus metrics: the front counts every request itself; handler processes write what the
handler itself reports to files the front sums.

The front answers every request, so what it counts (requests by status, durations, timeouts,
refusals, in flight and queued, worker restarts) is plain numbers in its own process, made into
metric families at a scrape: an increment is a few tens of nanoseconds, nothing touches the
disk, and prometheus_client is imported at the first scrape. What a handler counts
itself (its own prometheus_client metrics, Seldon's reported metrics) happens in handler
processes that come and go, so they use prometheus_client's multiprocess mode: each writes
memory-mapped files in one directory that the front creates, and a scrape sums them, keeping
what a replaced process counted. The mode is chosen by an environment variable that
prometheus_client reads when first imported; the front sets it for its children only
(:func:`handler_environment`), never for itself.

prometheus_client from 0.8 is served: seldon-core 1.18, which Seldon users keep installed beside
their model, pins ``prometheus-client<0.9`` (``tests/test_styles_seldon_core_env.py`` serves from
there, the rest of the suite with the newest release). 0.8 reads the directory only from the
lower-case variable and has no gauge mode that keeps the most recent value; both are handled here.
"""

from __future__ import annotations

import bisect
import glob
import itertools
import logging
import os
import platform
import threading
from collections.abc import Callable, Iterator, Mapping
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
#: The same as older prometheus_client releases spell it (0.8, under seldon-core's pin, reads
#: only this one). Newer releases read the upper-case one first and warn only when it is unset.
_LEGACY_METRICS_DIR_VARIABLE: Final = "prometheus_multiproc_dir"
CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
#: What handler processes never get of the front's environment: the API keys.
_FRONT_ONLY_VARIABLES: Final = frozenset({"ABEJA_RUNTIME_API_KEYS"})
_PREFIX: Final = "abeja_runtime"
#: Seconds; from a cache hit (5 ms) to the default 60 s timeout, so that a timeout shows as
#: its own bucket rather than disappearing into +Inf.
_DURATION_BUCKETS: Final = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, float("inf"),
)  # fmt: skip
#: Seconds; a call that finds a free slot waits well under a millisecond, so the lower buckets
#: are finer: an autoscaler looks at when waits begin to grow.
_QUEUE_WAIT_BUCKETS: Final = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, float("inf"),
)  # fmt: skip


def handler_environment(directory: str) -> dict[str, str]:
    """The environment of a handler process: this one's, without the API keys, with the
    metrics directory under both of its names, so that any prometheus_client the handler's
    environment holds finds it."""
    environment = {k: v for k, v in os.environ.items() if k not in _FRONT_ONLY_VARIABLES}
    return {**environment, METRICS_DIR_VARIABLE: directory, _LEGACY_METRICS_DIR_VARIABLE: directory}


#: Seconds; a streamed answer's first chunk, from a token's few milliseconds to a long prompt.
_FIRST_CHUNK_BUCKETS: Final = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    float("inf"),
)  # fmt: skip
#: Seconds between chunks: a token every few milliseconds to a slow producer's pauses.
_BETWEEN_CHUNKS_BUCKETS: Final = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    float("inf"),
)  # fmt: skip


class FrontMetrics:
    """What the front counts, and the scrape of everything.

    Everything the front counts is plain numbers, turned into metric families only when scraped
    (:class:`_RequestStats`, :class:`_Events`): an addition costs a few tens of nanoseconds
    where a prometheus_client metric takes a lock, and prometheus_client is imported at the
    first scrape, not on the runtime's way to its first answer.
    """

    def __init__(
        self,
        version: str,
        handler: str,
        style: str,
        directory: str,
        gauges: Callable[[], tuple[int, int]],
    ) -> None:
        self._directory = directory
        self._stats = _RequestStats(gauges)
        self._events = _Events(
            {
                "version": version,
                "python": platform.python_version(),
                "handler": handler,
                "style": style,
            }
        )
        self._registry: Any = None
        self.observe = self._stats.observe
        self.queue_waited = self._stats.queue_wait.observe
        self.rejected = self._events.rejected.add
        self.abandoned = self._events.abandoned.add
        self.rejected_head = self._events.rejected_heads.add
        self.worker_restarted = self._events.restarts.add
        self.reloaded = self._events.reloads.add

    def tenants(self, names: tuple[str, ...]) -> None:
        """Count calls per tenant from now on (``names``: those with a weight, and ``other``)."""
        self._events.tenants(names)

    def tenant_call(self, tenant: str, served: bool) -> None:
        """A call of ``tenant`` (its metrics label) ended: answered by the handler, or not."""
        events = self._events
        counts = events.tenant_served if served else events.tenant_refused
        if counts is not None:
            counts.add(tenant)

    def batching(self) -> _BatchMetrics:
        """The batch metrics, shown (all at 0) from the first call: only a front that batches
        (``--max-batch-size``) shows them."""
        if self._events.batches is None:
            self._events.batches = _BatchMetrics()
        return self._events.batches

    def first_chunk(self, seconds: float) -> None:
        self._events.first_chunk.observe(seconds)

    def between_chunks(self, seconds: float) -> None:
        self._events.between_chunks.observe(seconds)

    def worker_started(self, seconds: float, forked: bool) -> None:
        self._events.worker_starts["forked" if forked else "imported"].observe(seconds)

    def started(self, part: str, seconds: float) -> None:
        self._events.start[part] = seconds

    def worker_gone(self, pid: int) -> None:
        """Drop a dead handler process's live gauges; its counters stay in the sums. Only a
        process that kept a live gauge wrote such a file: for the others prometheus_client is
        not imported (its import pauses the front's loop for tens of milliseconds)."""
        if not glob.glob(os.path.join(glob.escape(self._directory), f"gauge_live*_{pid}.db")):
            return
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid, self._directory)  # type: ignore[no-untyped-call]

    def render(self) -> bytes:
        """The Prometheus text exposition: the front's metrics, then the handlers' summed."""
        from prometheus_client import CollectorRegistry, generate_latest, multiprocess

        if self._registry is None:
            self._registry = CollectorRegistry()
            self._registry.register(self._stats)
            self._registry.register(self._events)
        handlers = CollectorRegistry()
        multiprocess.MultiProcessCollector(handlers, self._directory)  # type: ignore[no-untyped-call]
        return generate_latest(self._registry) + generate_latest(handlers)


class _Counts:
    """A counter by one label, as plain numbers: the label's values are known, and shown at 0."""

    __slots__ = ("counts", "documentation", "label", "name")

    def __init__(self, name: str, documentation: str, label: str, values: tuple[str, ...]) -> None:
        self.name, self.documentation, self.label = f"{_PREFIX}_{name}", documentation, label
        self.counts = dict.fromkeys(values, 0)

    def add(self, value: str) -> None:
        self.counts[value] = self.counts.get(value, 0) + 1

    def family(self) -> Any:
        from prometheus_client.core import CounterMetricFamily

        family = CounterMetricFamily(self.name, self.documentation, labels=[self.label])
        for value, count in self.counts.items():
            family.add_metric([value], count)
        return family


class _Events:
    """The rare events the front counts (refusals, restarts, reloads) and its start."""

    def __init__(self, build: dict[str, str]) -> None:
        self._build = build
        self.rejected = _Counts(
            "rejected_requests",
            "Requests answered 503 without calling the handler: busy (queue full), "
            "unavailable (no worker ready) or deadline (the caller's deadline comes before the "
            "expected wait for a worker ends).",
            "reason",
            (),
        )
        self.restarts = _Counts(
            "worker_restarts",
            "Workers replaced after they died (crashed), exited after a failed warm-up "
            "(warmup_failed), their handler got stuck past timeout + grace (stuck), they served "
            "--max-requests (max_requests), grew past --max-worker-memory (memory), or a new "
            "version of the handler replaced them (reload).",
            "reason",
            ("crashed", "warmup_failed", "stuck", "max_requests", "memory", "reload"),
        )
        self.reloads = _Counts(
            "reloads",
            "Reloads of the handler (SIGHUP): done (every worker serves the new version) or "
            "failed (the new version could not be loaded, or its first worker did not get "
            "ready; the old version serves on).",
            "outcome",
            ("done", "failed"),
        )
        self.abandoned = _Counts(
            "abandoned_requests",
            "Calls whose client left before their whole answer (each counted 499), by the stage "
            "they reached: receiving (their body was arriving), queued (never ran), running "
            "(cancelled in their worker) or answering (their streamed or big answer was being "
            "written).",
            "stage",
            ("receiving", "queued", "running", "answering"),
        )
        self.rejected_heads = _Counts(
            "rejected_heads",
            "Request heads answered without a handler call, their connection closed: malformed "
            "(400: not HTTP), too_large (431: past --max-head-size) or timeout (408: not whole "
            "within --request-head-timeout).",
            "reason",
            ("malformed", "too_large", "timeout"),
        )
        self.worker_starts = {
            how: _Histogram(
                (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, float("inf"))
            )
            for how in ("forked", "imported")
        }
        #: Streamed answers: from a request's arrival to its first chunk, and between chunks.
        self.first_chunk = _Histogram(_FIRST_CHUNK_BUCKETS)
        self.between_chunks = _Histogram(_BETWEEN_CHUNKS_BUCKETS)
        #: The runtime's start, in parts (``front/startup.py``).
        self.start: dict[str, float] = {}
        self.batches: _BatchMetrics | None = None
        #: With tenants on (``--tenant-header``): each tenant's calls answered by its handler
        #: and refused by the front (503, 504), the tenants named in ``--tenant-weights`` and
        #: ``other``.
        self.tenant_served: _Counts | None = None
        self.tenant_refused: _Counts | None = None

    def tenants(self, names: tuple[str, ...]) -> None:
        """Count calls per tenant from now on, for ``names`` (and ``other``)."""
        self.tenant_served = _Counts(
            "tenant_served_requests",
            "Calls of each tenant answered by the handler (--tenant-header; the tenants of "
            "--tenant-weights, the others as other).",
            "tenant",
            names,
        )
        self.tenant_refused = _Counts(
            "tenant_refused_requests",
            "Calls of each tenant the front answered for: refused (503: its share of the queue "
            "full, its deadline too near) or timed out (504).",
            "tenant",
            names,
        )

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily

        for counts in (self.rejected, self.restarts, self.reloads):
            yield counts.family()
        starts = HistogramMetricFamily(
            f"{_PREFIX}_worker_start_seconds",
            "Seconds from a worker's start to its readiness: forked from the template "
            "(--preload) or importing the handler itself (imported), its warm-up included.",
            labels=["how"],
        )
        for how, histogram in self.worker_starts.items():
            starts.add_metric([how], histogram.buckets_named(), histogram.total)
        yield starts
        start = GaugeMetricFamily(
            f"{_PREFIX}_start_seconds",
            "The runtime's start, in parts, from its first import: runtime (its own imports and "
            "set-up, until it starts the first handler process), handler (the handler's import, "
            "the last one), ready (until it serves: a worker ready, its servers listening).",
            labels=["part"],
        )
        for part, seconds in self.start.items():
            start.add_metric([part], seconds)
        yield start
        yield self.first_chunk.family(
            HistogramMetricFamily,
            f"{_PREFIX}_time_to_first_chunk_seconds",
            "Seconds from a streamed answer's request to its first chunk going to its client "
            "(the handler's first yield, and the queue before it).",
        )
        yield self.between_chunks.family(
            HistogramMetricFamily,
            f"{_PREFIX}_inter_chunk_seconds",
            "Seconds between a streamed answer's chunks going to its client.",
        )
        yield self.abandoned.family()
        yield self.rejected_heads.family()
        if self.tenant_served is not None and self.tenant_refused is not None:
            yield self.tenant_served.family()
            yield self.tenant_refused.family()
        if self.batches is not None:
            yield from self.batches.families()
        info = GaugeMetricFamily(
            f"{_PREFIX}_build_info",
            "Always 1; the labels say which runtime serves which handler.",
            labels=list(self._build),
        )
        info.add_metric(list(self._build.values()), 1)
        yield info


class _BatchMetrics:
    """How batches form: their sizes, how long requests waited for theirs, why each went."""

    def __init__(self) -> None:
        self._sizes = _Histogram((1, 2, 4, 8, 16, 32, 64, 128, 256, float("inf")))
        self._waits = _Histogram(
            (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, float("inf"))
        )
        self._released = _Counts(
            "batches",
            "Batches sent to a worker, by why: full (--max-batch-size requests waited), waited "
            "(its first request had waited --max-batch-wait while every worker ran a batch), "
            "idle (a worker was free: what waited went at once).",
            "reason",
            ("full", "waited", "idle"),
        )

    def released(self, size: int, reason: str, waits: list[float]) -> None:
        self._sizes.observe(size)
        self._released.add(reason)
        for wait in waits:
            self._waits.observe(wait)

    def families(self) -> Iterator[Any]:
        from prometheus_client.core import HistogramMetricFamily

        yield self._sizes.family(
            HistogramMetricFamily,
            f"{_PREFIX}_batch_size",
            "Requests per handler call (--max-batch-size).",
        )
        yield self._waits.family(
            HistogramMetricFamily,
            f"{_PREFIX}_batch_wait_seconds",
            "How long each batched request waited in the front's queue for its batch to go.",
        )
        yield self._released.family()


class _RequestStats:
    """The per-request counts as plain numbers, made into metric families at scrape time."""

    def __init__(self, gauges: Callable[[], tuple[int, int]]) -> None:
        self._gauges = gauges  # (in flight, queued), read when scraped
        self._durations = _Histogram(_DURATION_BUCKETS)
        #: Seconds from a call's arrival in the queue to its handler call (or to its end in
        #: the queue: its deadline passed, its client left), whichever worker ran it.
        self.queue_wait = _Histogram(_QUEUE_WAIT_BUCKETS)
        self._codes: dict[int, int] = {}
        self._timeouts = 0

    def observe(self, status: int, seconds: float) -> None:
        """One answered request."""
        codes = self._codes
        codes[status] = codes.get(status, 0) + 1
        self._durations.observe(seconds)
        if status == 504:
            self._timeouts += 1

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        requests = CounterMetricFamily(
            f"{_PREFIX}_requests",
            "Handler requests answered, by HTTP status code (health checks and scrapes are "
            "not counted).",
            labels=["code"],
        )
        for code, count in sorted(self._codes.items()):
            requests.add_metric([str(code)], count)
        yield requests
        yield self._durations.family(
            HistogramMetricFamily,
            f"{_PREFIX}_request_duration_seconds",
            "Seconds from a request's arrival until its response was sent.",
        )
        yield self.queue_wait.family(
            HistogramMetricFamily,
            f"{_PREFIX}_queue_wait_seconds",
            "Seconds handler calls waited in the queue for a free handler slot, from their "
            "arrival there (their body read) to their handler call, across all workers; calls "
            "given up in the queue (deadline, client gone) too.",
        )
        yield CounterMetricFamily(
            f"{_PREFIX}_timeouts",
            "Requests answered 504 because the handler did not answer within the timeout.",
            value=self._timeouts,
        )
        in_flight, queued = self._gauges()
        yield GaugeMetricFamily(
            f"{_PREFIX}_in_flight_requests",
            "Handler requests being served now (queued ones included).",
            value=in_flight,
        )
        yield GaugeMetricFamily(
            f"{_PREFIX}_queued_requests",
            "Handler calls waiting for a free handler slot now.",
            value=queued,
        )


class _Histogram:
    """A histogram as plain numbers (an observation is a bisect and two additions), made into
    a metric family when scraped."""

    __slots__ = ("_bounds", "_buckets", "_sum", "buckets")

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self._bounds = buckets[:-1]
        self._buckets = [0] * len(buckets)  # per bucket, not cumulative
        self._sum = 0.0

    def observe(self, seconds: float) -> None:
        self._buckets[bisect.bisect_left(self._bounds, seconds)] += 1
        self._sum += seconds

    @property
    def total(self) -> float:
        return self._sum

    def buckets_named(self) -> list[tuple[str, int]]:
        """Each bucket's bound, as Prometheus writes it, and its cumulative count."""
        cumulative = itertools.accumulate(self._buckets)
        return [
            (_bucket_name(bound), count)
            for bound, count in zip(self.buckets, cumulative, strict=True)
        ]

    def family(self, make: Any, name: str, documentation: str) -> Any:
        return make(name, documentation, buckets=self.buckets_named(), sum_value=self._sum)


def _bucket_name(bound: float) -> str:
    from prometheus_client.utils import floatToGoString

    return str(floatToGoString(bound))  # type: ignore[no-untyped-call]


#: Seldon's TIMER buckets, in seconds: 0, then 50 log-spaced bounds from 1 ms to 30 s.
_TIMER_BUCKETS: Final = (0.0, *(0.001 * 30_000 ** (i / 49) for i in range(50)), float("inf"))


class ReportedMetrics:
    """Metrics a handler reports as values (Seldon's ``COUNTER``, ``GAUGE`` and ``TIMER``).

    Each key becomes a metric on first use, with the report's tags as labels: a counter adds
    the value, a gauge is set to it (the most recent report of a live worker wins; with a
    prometheus_client that lacks that mode, each live worker's, labelled by pid), a timer
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
        try:
            return Gauge(key, text, labels, multiprocess_mode="livemostrecent", registry=None)
        except ValueError:
            # An older release has no such mode (0.8 has not; an invalid name raises again
            # below). Then each live worker's latest value, labelled by its pid, as
            # seldon-core labels every reported metric by its worker.
            return Gauge(key, text, labels, multiprocess_mode="liveall", registry=None)
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
