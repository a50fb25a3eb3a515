"""The runtime's start, measured (:class:`StartUp`): its own share (the interpreter, its imports
and set-up), the handler's import, and each worker's time from its start to its readiness, for
one log line at the first readiness and the metrics (``abeja_runtime_start_seconds``,
``abeja_runtime_worker_start_seconds``)."""

from __future__ import annotations

import logging
import os
import time

from abeja_runtime.frames import Ready
from abeja_runtime.metrics import FrontMetrics

__all__ = ["StartUp", "process_age"]

_log = logging.getLogger("abeja_runtime")


def process_age() -> float | None:
    """Seconds since this process started (``/proc``: to the kernel's clock tick), or ``None``."""
    try:
        with open("/proc/self/stat", "rb") as stat:
            started = int(stat.read().rsplit(b")", 1)[1].split()[19])
        with open("/proc/uptime", "rb") as uptime:
            now = float(uptime.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, now - started / os.sysconf("SC_CLK_TCK"))


class StartUp:
    """When the runtime began, and what each worker's readiness says of its start."""

    def __init__(self) -> None:
        #: The runtime's own start: from its process's start to the handler processes' spawn.
        self.own = 0.0
        self._spawned_at = 0.0
        self._first = True

    def spawning(self) -> None:
        """The runtime starts its handler processes now."""
        self._spawned_at = time.monotonic()
        self.own = process_age() or 0.0

    def ready(self, started_at: float, ready: Ready, metrics: FrontMetrics | None) -> None:
        """A worker started at ``started_at`` (``time.monotonic``) said ``ready``."""
        now = time.monotonic()
        if metrics is not None:
            metrics.worker_started(now - started_at, ready.forked)
            metrics.started("handler", ready.load_seconds)
        if not self._first:
            return
        self._first = False
        total = self.own + now - self._spawned_at
        rest = max(0.0, total - self.own - ready.load_seconds)
        where = "in the template" if ready.forked else "in the worker"
        then = "the template's start, the first worker's fork and warm-up"
        if not ready.forked:
            then = "the first worker's start and warm-up"
        _log.info(
            "ready %.2f s after the runtime started: %.2f s the runtime's own start, %.2f s the "
            "handler's import (%s), %.2f s the rest (%s)",
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
