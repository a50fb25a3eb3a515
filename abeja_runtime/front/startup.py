"""The runtime's start, measured (:class:`StartUp`): its own share (from its first import in the
front's process), the handler's import, and each worker's time to its readiness, for one log
line once the runtime serves and the metrics (``abeja_runtime_start_seconds``,
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
        self._spawned_at = 0.0
        #: The first worker's readiness, until the runtime serves.
        self._first: Ready | None = None
        self._listening = False
        self._said = False

    def spawning(self, at: float) -> None:
        """The runtime started its first handler process at ``at`` (``time.monotonic``)."""
        self._spawned_at = at

    def ready(self, started_at: float, ready: Ready, metrics: FrontMetrics | None) -> None:
        """A worker started at ``started_at`` (``time.monotonic``) said ``ready``."""
        if metrics is not None:
            metrics.worker_started(time.monotonic() - started_at, ready.forked)
            metrics.started("handler", ready.load_seconds)
        if self._first is None:
            self._first = ready
            self._serving(metrics)

    def listening(self, metrics: FrontMetrics | None) -> None:
        """The runtime's servers accept requests now."""
        self._listening = True
        self._serving(metrics)

    def _serving(self, metrics: FrontMetrics | None) -> None:
        """Once a worker is ready and the servers accept requests."""
        ready = self._first
        if self._said or not self._listening or ready is None:
            return
        self._said = True
        own = self._spawned_at - IMPORTED_AT
        total = time.monotonic() - IMPORTED_AT
        where, then = "in the worker", "the first worker's start and warm-up"
        if ready.forked:
            where, then = (
                "in the template",
                "the template's start, the first worker's fork and warm-up",
            )
        _log.info(
            "ready %.2f s after the runtime started: %.2f s the runtime's own start, %.2f s the "
            "handler's import (%s), %.2f s the rest (%s, the front's servers)",
            total,
            own,
            ready.load_seconds,
            where,
            max(0.0, total - own - ready.load_seconds),
            then,
        )
        if metrics is not None:
            metrics.started("runtime", own)
            metrics.started("ready", total)
