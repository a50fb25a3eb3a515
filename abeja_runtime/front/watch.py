"""The watch over the handler processes (:class:`Watch`): a process that exited without a pidfd
to say so, a handler stuck past its limits, a worker grown past ``--max-worker-memory``, for the
lifecycle to act on (``lifecycle.py``); and the orphans the front adopted, reaped."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Final

from abeja_runtime.config import Config, MiB
from abeja_runtime.front.lifecycle import Lifecycle
from abeja_runtime.front.pending import Member, ProcessState
from abeja_runtime.front.processes import resident_memory
from abeja_runtime.front.scheduler import Scheduler

__all__ = ["Watch"]

#: How often the watch looks at the processes.
_TICK: Final = 0.25


class Watch:
    """Looks at ``lifecycle``'s processes every :data:`_TICK` seconds, from :meth:`start`."""

    def __init__(self, config: Config, lifecycle: Lifecycle, scheduler: Scheduler) -> None:
        self._config = config
        self._lifecycle = lifecycle
        self._scheduler = scheduler
        self._task: asyncio.Task[None]

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    def stop(self) -> None:
        self._task.cancel()

    async def _run(self) -> None:
        lifecycle = self._lifecycle
        while True:
            await asyncio.sleep(_TICK)
            lifecycle.reap_orphans()
            now = time.monotonic()
            for member in list(lifecycle.members):
                child = member.process.child
                if (
                    member.process.exit_fd is None
                    and child is not None
                    and child.poll() is not None
                ):
                    lifecycle.exited(member)
                elif member.state is not ProcessState.READY:
                    continue
                elif (stuck := self.stuck(member, now)) is not None:
                    lifecycle.recycle(member, stuck)
                else:
                    self._check_memory(member)

    def stuck(self, member: Member, now: float) -> str | None:
        """What is stuck in ``member``'s handler (``None``: nothing): a call not answered
        ``timeout + grace`` after it was sent, or a stream still running ``grace`` after it was
        withdrawn. A stream that goes on producing is never stuck: its limits end it
        (``stream_limits.py``)."""
        config = self._config
        limit = config.stuck_after
        if limit is None:
            return None
        running = self._scheduler.calls_running(member)
        for pending in itertools.islice(member.sent.values(), running):
            if not pending.streaming:
                if now - pending.sent_at > limit:
                    return (
                        f"a handler call in worker {member.pid} has been running for more than "
                        f"{limit:g} s (timeout {config.timeout:g} s + grace "
                        f"{config.grace_period:g} s)"
                    )
            elif pending.withdrawn_at and now - pending.withdrawn_at > config.grace_period:
                return (
                    f"a streamed answer of worker {member.pid} has gone on for more than "
                    f"{config.grace_period:g} s (the grace period) after it was cut, its "
                    "generator not stopping"
                )
        return None

    def _check_memory(self, member: Member) -> None:
        limit = self._config.max_worker_memory
        if not limit or member.retiring:
            return
        resident = resident_memory(member.pid)
        if resident is not None and resident > limit:
            self._lifecycle.retire(
                member,
                "memory",
                f"it holds {resident / MiB:.0f} MiB, more than --max-worker-memory "
                f"{limit / MiB:.0f} MiB",
            )
