"""The front's handler processes behind one queue (:class:`HandlerPool`), as the call service
sees them: it joins the queue (``scheduler.py``) and the processes' lives (``lifecycle.py``),
takes in the frames the processes send, and watches the processes: one that exited without a
pidfd to say so, a handler stuck past its limits, a worker grown past ``--max-worker-memory``.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Callable
from typing import Any, Final, get_args

from abeja_runtime.config import Config, MiB
from abeja_runtime.frames import (
    Answer,
    Cancel,
    Chunk,
    End,
    Frame,
    GivenBack,
    LoadFailed,
    Ready,
    RpcAnswer,
    read_fd,
)
from abeja_runtime.front.answer_file import ANSWER_FILE_ABOVE, AnswerFile
from abeja_runtime.front.interpreter import Prestarted
from abeja_runtime.front.lifecycle import Lifecycle, ProcessFactory
from abeja_runtime.front.pending import STREAM_FAILED, Member, PendingCall, ProcessState
from abeja_runtime.front.processes import resident_memory
from abeja_runtime.front.scheduler import Scheduler
from abeja_runtime.metrics import handler_environment

__all__ = ["HandlerPool"]

#: How often the watch looks at the processes.
_TICK: Final = 0.25


class HandlerPool:
    """``config.workers`` handler processes behind one queue."""

    def __init__(
        self,
        config: Config,
        metrics_dir: str,
        on_first_ready: Callable[[], None],
        on_load_failed: Callable[[str, str], None],
        process_factory: ProcessFactory | None = None,
        clock: Callable[[], float] = time.monotonic,
        prestarted: Prestarted | None = None,
    ) -> None:
        """``process_factory`` and the scheduler's ``clock``: the unit tests give fakes;
        ``prestarted``: the first process's interpreter, started already."""
        members: list[Member] = []
        self.scheduler = Scheduler(config, members, asyncio.get_running_loop(), clock)
        self.lifecycle = Lifecycle(
            config,
            handler_environment(metrics_dir),
            members,
            self.scheduler,
            self.received,
            on_first_ready,
            on_load_failed,
            process_factory,
            prestarted,
        )
        self._config = config
        self._watcher: asyncio.Task[None]
        self._ids = itertools.count(1)
        #: A handler process answered with a stream: from now on, the calls to processes that
        #: write their streams themselves go with their client's connection (lending it costs
        #: a handler that never streams a tenth of its small calls' rate).
        self.lends_connections = False
        # What the call service asks the scheduler, straight.
        self.submit = self.scheduler.submit
        self.admit_before = self.scheduler.admit_before
        self.withdraw = self.scheduler.withdraw
        self.running = self.scheduler.running
        self.free_places = self.scheduler.free_places

    def start(self) -> None:
        self.lifecycle.start()
        self._watcher = asyncio.create_task(self._watch())

    def close(self) -> None:
        self._watcher.cancel()
        self.lifecycle.kill_all()

    # -- what the call service asks -----------------------------------------------------------

    def next_id(self) -> int:
        return next(self._ids)

    @property
    def serving(self) -> bool:
        """Readiness: a ready process takes calls (:attr:`admitting`: a new call is taken)."""
        return self.lifecycle.serving

    @property
    def admitting(self) -> bool:
        return self.lifecycle.admitting

    @property
    def front_paths(self) -> tuple[str, ...]:
        return self.lifecycle.front_paths

    @property
    def queued(self) -> int:
        return self.scheduler.queued

    def stop_stream(self, pending: PendingCall) -> None:
        """The client of a stream that ``pending``'s process writes itself left: the process
        stops it (:class:`Cancel`), and its ``End`` says how it ended."""
        if pending.member is not None:
            pending.member.send(Cancel(pending.frame.id))
            pending.withdrawn_at = time.monotonic()  # the watch's grace: then it is stuck

    # -- the watch ----------------------------------------------------------------------------

    async def _watch(self) -> None:
        """Every :data:`_TICK`: the orphans the front adopted reaped; a process that exited
        without a pidfd to say so, one stuck in its handler, one grown past
        ``--max-worker-memory``, for the lifecycle to act on."""
        lifecycle = self.lifecycle
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
                elif (stuck := self._stuck(member, now)) is not None:
                    lifecycle.recycle(member, stuck)
                else:
                    self._check_memory(member)

    def _stuck(self, member: Member, now: float) -> str | None:
        """What is stuck in ``member``'s handler (``None``: nothing): a call not answered
        ``timeout + grace`` after it was sent, or a stream still running ``grace`` after it was
        withdrawn. A stream that goes on producing is never stuck: its limits end it
        (``stream_limits.py``)."""
        config = self._config
        limit = config.stuck_after
        if limit is None:
            return None
        running = self.scheduler.calls_running(member)
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
        limit, lifecycle = self._config.max_worker_memory, self.lifecycle
        if not limit or member.retiring:
            return
        resident = resident_memory(member.pid)
        if resident is not None and resident > limit:
            lifecycle.retire(
                member,
                "memory",
                f"it holds {resident / MiB:.0f} MiB, more than --max-worker-memory "
                f"{limit / MiB:.0f} MiB",
            )

    # -- the processes' frames ----------------------------------------------------------------

    def received(self, member: Member, frame: Frame, fd: int | None) -> None:
        """A frame from ``member``, to the receiver of its class (:attr:`_RECEIVERS`)."""
        self._RECEIVERS[type(frame)](self, member, frame, fd)

    def _settle(self, member: Member, pending: PendingCall) -> None:
        """``pending`` is over in ``member``: its slot goes to the next call."""
        self.scheduler.settle(member, pending)
        self.lifecycle.answered(member)

    def _answer_received(self, member: Member, frame: Answer | RpcAnswer, fd: int | None) -> None:
        """An answer (or the head of a streamed one), with its body or message as a memfd when
        ``fd`` is given; dropped when nobody waits for it any more."""
        pending = member.sent.get(frame.id)
        streamed = isinstance(frame, Answer) and frame.streamed
        if pending is not None and streamed:
            pending.streaming = True
            pending.written = frame.written  # type: ignore[union-attr]  # an Answer
            self.lends_connections = self.lends_connections or member.writes_streams
        if pending is None or pending.abandoned or pending.answer.done():
            self._dropped(member, pending, fd, streamed=streamed)
            return
        if streamed:
            pending.chunks = asyncio.Queue()
        elif fd is not None:
            if isinstance(frame, RpcAnswer):
                frame = frame._replace(payload=read_fd(fd))
            elif os.fstat(fd).st_size > ANSWER_FILE_ABOVE:  # written from there
                pending.answer_file = AnswerFile(fd)
            else:
                frame = frame._replace(body=read_fd(fd))
        pending.answer.set_result(frame)
        if not streamed:  # a stream's End settles it
            self._settle(member, pending)

    def _dropped(
        self, member: Member, pending: PendingCall | None, fd: int | None, *, streamed: bool
    ) -> None:
        """An answer that nobody waits for: its slot freed (a stream's at its ``End``)."""
        if fd is not None:
            os.close(fd)
        if pending is not None and not streamed:  # (a stream's chunks are dropped until End)
            if pending.chunks is not None:  # a stream whose End never came: cut short
                pending.end_stream(STREAM_FAILED)
            self._settle(member, pending)

    def _chunk_received(self, member: Member, frame: Chunk, fd: int | None) -> None:
        pending = member.sent.get(frame.id)
        if pending is not None and pending.chunks is not None and not pending.abandoned:
            pending.chunks.put_nowait(frame.data if fd is None else AnswerFile(fd))
        elif fd is not None:
            os.close(fd)

    def _end_received(self, member: Member, frame: End, fd: int | None) -> None:
        pending = member.sent.get(frame.id)
        if pending is not None:
            pending.report = frame.written
            # Its slot freed first: a stream its process wrote ends in the responder now, and
            # the connection's next request may be taken at once.
            self._settle(member, pending)
            if pending.chunks is not None:
                pending.end_stream(STREAM_FAILED if frame.failed else None)

    def _given_back_received(self, member: Member, frame: GivenBack, fd: int | None) -> None:
        self.scheduler.given_back(member, frame.id)
        self.lifecycle.close_if_done(member)

    def _ready_received(self, member: Member, frame: Ready, fd: int | None) -> None:
        member.writes_streams = frame.writes_streams
        self.lifecycle.ready(member, frame)

    def _load_failed_received(self, member: Member, frame: LoadFailed, fd: int | None) -> None:
        self.lifecycle.load_failed(member, frame.text, frame.details)

    def _not_for_the_front(self, member: Member, frame: Frame, fd: int | None) -> None:
        """A frame the front sends and never receives (a handler process does not send it)."""
        if fd is not None:
            os.close(fd)

    #: The receiver of each frame class, by the frame's exact class: one lookup per frame, where
    #: an ``isinstance`` ladder or ``match`` tries the classes in turn.
    _RECEIVERS: Final[dict[type[Any], Callable[[HandlerPool, Member, Any, int | None], None]]] = {
        **dict.fromkeys(get_args(Frame), _not_for_the_front),
        Answer: _answer_received,
        RpcAnswer: _answer_received,
        Chunk: _chunk_received,
        End: _end_received,
        GivenBack: _given_back_received,
        Ready: _ready_received,
        LoadFailed: _load_failed_received,
    }
