"""The front and its handler processes run under SCHED_BATCH: none preempts another on waking.

Where they share a core, every wake-up that preempts costs twice: a context switch, and the
caches of the process that was running, which it then refills. Under SCHED_BATCH the front
reads all the requests that arrived and hands them over in one write before a handler process
runs them one after the other, and it takes their answers in one read when it runs again.
Measured on one core (``benchmarks/PROFILE.md``): small JSON 9,600 → 12,200 requests/s with
the handler processes alone under it; with the front too, a 1 ms numpy call 1,262 → 1,362
requests/s (the front's own work per request 120 → 55 µs of CPU: it no longer runs cold after
every answer), small JSON unchanged. The cost: a request that arrives while a handler runs
waits for the end of that process's time slice (a few ms) rather than for its answer, on a
core they share. The time-sharing between them stays fair; other processes are not affected.
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["run_as_batch"]


def run_as_batch() -> None:
    """This process (and the threads it starts from now on) under SCHED_BATCH, where the
    system has it."""
    with contextlib.suppress(OSError, AttributeError):
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
