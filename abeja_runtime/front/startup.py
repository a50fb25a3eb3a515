"""The runtime's start, measured (:class:`StartUp`): its own share (its imports and set-up, from
its first import in the front's process: the interpreter's own start is not counted), the
handler's import, and each worker's time from its start to its readiness, for one log line once
the runtime serves and the metrics (``abeja_runtime_start_seconds``,
``abeja_runtime_worker_start_seconds``)."""

from __future__ import annotations

import logging
import time

from abeja_runtime import IMPORTED_AT
from abeja_runtime.frames import Ready
from abeja_runtime.metrics import FrontMetrics

__all__ = ["StartUp"]

_log = logging.getLogger("abeja_runtime")


class StartUp:
    """When the runtime began, and what each worker's readiness says of its start."""

    def __init__(self) -> None:
        #: The runtime's own start: from its first import to the first handler process's start.
        self.own = 0.0
        self._spawned_at = 0.0
        #: The first worker's readiness (when, and what it said), until the runtime serves.
        self._first: tuple[float, Ready] | None = None
        self._listening = False
        self._said = False

    def spawning(self, at: float) -> None:
        """The runtime started its first handler process at ``at`` (``time.monotonic``)."""
        self._spawned_at = at
        self.own = self._spawned_at - IMPORTED_AT

    def ready(self, started_at: float, ready: Ready, metrics: FrontMetrics | None) -> None:
        """A worker started at ``started_at`` (``time.monotonic``) said ``ready``."""
        now = time.monotonic()
        if metrics is not None:
            metrics.worker_started(now - started_at, ready.forked)
            metrics.started("handler", ready.load_seconds)
        if self._first is None:
            self._first = (now, ready)
            self._serving(metrics)

    def listening(self, metrics: FrontMetrics | None) -> None:
        """The runtime's servers accept requests now (its imports and set-up done)."""
        self._listening = True
        self._serving(metrics)

    def _serving(self, metrics: FrontMetrics | None) -> None:
        """Once a worker is ready and the servers accept requests: the log line, the metrics."""
        if self._said or not self._listening or self._first is None:
            return
        self._said = True
        ready = self._first[1]
        total = self.own + time.monotonic() - self._spawned_at
        rest = max(0.0, total - self.own - ready.load_seconds)
        where = "in the template" if ready.forked else "in the worker"
        then = "the template's start, the first worker's fork and warm-up"
        if not ready.forked:
            then = "the first worker's start and warm-up"
        _log.info(
            "ready %.2f s after the runtime started: %.2f s the runtime's own start, %.2f s the "
            "handler's import (%s), %.2f s the rest (%s, the front's servers)",
            total,
            self.own,
            ready.load_seconds,
            where,
            rest,
            then,
        )
        if metrics is not None:
            metrics.started("runtime", self.own)
            metrics.started("ready", total)
