"""The front's handler processes behind one queue (:class:`HandlerPool`): what the call service
and the supervisor talk to.

Rooms of one job each: the queue and where each call goes (``scheduler.py``, with the batching
rule in ``batching.py``), the processes' lives (``lifecycle.py``) and the watch over them
(``watch.py``), and the record of each process they share (``members.py``). This module joins
them, and takes in the frames the processes send: each answer settles its call, and frees its
slot for the next.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import Callable
from typing import Any, Final, get_args

from abeja_runtime.config import Config
from abeja_runtime.frames import (
    Answer,
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
from abeja_runtime.front.lifecycle import Lifecycle, ProcessFactory
from abeja_runtime.front.members import Member
from abeja_runtime.front.pending import STREAM_FAILED, PendingCall
from abeja_runtime.front.processes import HandlerProcess
from abeja_runtime.front.scheduler import Scheduler
from abeja_runtime.front.watch import Watch
from abeja_runtime.metrics import FrontMetrics, handler_environment

__all__ = ["HandlerPool"]

_log = logging.getLogger("abeja_runtime")


class HandlerPool:
    """``config.workers`` handler processes behind one queue."""

    def __init__(
        self,
        config: Config,
        metrics_dir: str,
        on_change: Callable[[], None],
        on_load_failed: Callable[[str, str], None],
        process_factory: ProcessFactory = HandlerProcess,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``process_factory`` and the scheduler's ``clock``: the unit tests give fakes."""
        self.members: list[Member] = []
        self.scheduler = Scheduler(config, self.members, asyncio.get_running_loop(), clock)
        self.lifecycle = Lifecycle(
            config,
            handler_environment(metrics_dir),
            self.members,
            self.scheduler,
            self.received,
            on_change,
            on_load_failed,
            process_factory,
        )
        self._watch = Watch(config, self.lifecycle, self.scheduler)
        self._ids = itertools.count(1)
        self._metrics: FrontMetrics | None = None

    def start(self) -> None:
        self.lifecycle.start()
        self._watch.start()

    @property
    def metrics(self) -> FrontMetrics | None:
        return self._metrics

    @metrics.setter
    def metrics(self, metrics: FrontMetrics | None) -> None:
        self._metrics = self.scheduler.metrics = self.lifecycle.metrics = metrics

    def next_id(self) -> int:
        return next(self._ids)

    # -- what the call service asks -----------------------------------------------------------

    @property
    def serving(self) -> bool:
        """Readiness: a ready process takes calls (:attr:`admitting`: a new call is taken)."""
        return self.lifecycle.serving

    @property
    def admitting(self) -> bool:
        return self.lifecycle.admitting

    def submit(self, pending: PendingCall) -> None:
        """To a free slot, or the queue; ``ServiceBusy`` when the pool is full."""
        self.scheduler.submit(pending)

    def withdraw(self, pending: PendingCall) -> None:
        self.scheduler.withdraw(pending)

    def running(self, pending: PendingCall) -> bool:
        return self.scheduler.running(pending)

    def free_places(self) -> int:
        return self.scheduler.free_places()

    @property
    def queued(self) -> int:
        return self.scheduler.queued

    # -- what the supervisor asks -------------------------------------------------------------

    @property
    def processes(self) -> list[HandlerProcess]:
        return [member.process for member in self.members]

    @property
    def ever_ready(self) -> bool:
        return self.lifecycle.ever_ready

    @property
    def all_gone(self) -> asyncio.Event:
        return self.lifecycle.all_gone

    @property
    def style(self) -> str:
        return self.lifecycle.style

    @property
    def front_paths(self) -> tuple[str, ...]:
        return self.lifecycle.front_paths

    @property
    def rpc_methods(self) -> tuple[str, ...]:
        return self.lifecycle.rpc_methods

    def stop(self) -> None:
        """No new calls; each process finishes once its calls are answered."""
        self.lifecycle.stop()

    def kill_all(self) -> None:
        self.lifecycle.kill_all()

    def close(self) -> None:
        self._watch.stop()
        self.lifecycle.close()

    # -- the processes' frames ----------------------------------------------------------------

    def received(self, member: Member, frame: Frame, fd: int | None) -> None:
        """A frame from ``member``, to the receiver of its class (:attr:`_RECEIVERS`)."""
        self._RECEIVERS[type(frame)](self, member, frame, fd)

    def _settle(self, member: Member, pending: PendingCall) -> None:
        """``pending`` is over in ``member``: its slot goes to the next call."""
        self.scheduler.settle(member, pending)
        self.lifecycle.answered(member)
        self.scheduler.dispatch()

    def _answer_received(self, member: Member, frame: Answer, fd: int | None) -> None:
        pending = member.sent.get(frame.id)
        if pending is None or pending.abandoned or pending.answer.done():
            if fd is not None:
                os.close(fd)
            if pending is None:
                return
            if frame.streamed:
                pending.streaming = True
                pending.chunks = None  # chunks until End are dropped
            else:
                self._settle(member, pending)
            return
        if frame.streamed:
            pending.streaming = True
            pending.chunks = asyncio.Queue()
            pending.answer.set_result(frame)
            return
        if fd is not None:  # its body came as a memfd
            if os.fstat(fd).st_size > ANSWER_FILE_ABOVE:  # written from there
                pending.answer_file = AnswerFile(fd)
            else:
                frame = frame._replace(body=read_fd(fd))
        pending.answer.set_result(frame)
        self._settle(member, pending)

    def _rpc_answer_received(self, member: Member, frame: RpcAnswer, fd: int | None) -> None:
        pending = member.sent.get(frame.id)
        if pending is None or pending.abandoned or pending.answer.done():
            if fd is not None:
                os.close(fd)
            if pending is not None:
                self._settle(member, pending)
            return
        if fd is not None:  # its message came as a memfd
            frame = frame._replace(payload=read_fd(fd))
        pending.answer.set_result(frame)
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
            if pending.chunks is not None:
                pending.chunks.put_nowait(STREAM_FAILED if frame.failed else None)
            self._settle(member, pending)

    def _given_back_received(self, member: Member, frame: GivenBack, fd: int | None) -> None:
        self.scheduler.given_back(member, frame.id)
        self.lifecycle.close_if_done(member)
        self.scheduler.dispatch()

    def _ready_received(self, member: Member, frame: Ready, fd: int | None) -> None:
        self.lifecycle.ready(member, frame)

    def _load_failed_received(self, member: Member, frame: LoadFailed, fd: int | None) -> None:
        if self.lifecycle.ever_ready:
            _log.error("worker %s could not load the handler: %s", member.pid, frame.text)
        else:
            self.lifecycle.load_failed(frame.text, frame.details)

    def _not_for_the_front(self, member: Member, frame: Frame, fd: int | None) -> None:
        """A frame the front sends and never receives (a handler process does not send it)."""
        if fd is not None:
            os.close(fd)

    #: The receiver of each frame class, by the frame's exact class: one lookup per frame (an
    #: ``isinstance`` ladder tried the classes in turn; ``match`` with class patterns does
    #: too, and makes a set and a list for each pattern that matches).
    _RECEIVERS: Final[dict[type[Any], Callable[[HandlerPool, Member, Any, int | None], None]]] = {
        **dict.fromkeys(get_args(Frame), _not_for_the_front),
        Answer: _answer_received,
        RpcAnswer: _rpc_answer_received,
        Chunk: _chunk_received,
        End: _end_received,
        GivenBack: _given_back_received,
        Ready: _ready_received,
        LoadFailed: _load_failed_received,
    }
