"""Fake handler processes for the scheduler's unit tests: what the pool sees of a process (its
state, the calls it was sent, its frames), without a process behind it."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from abeja_runtime.config import Config
from abeja_runtime.frames import VERSION, Answer, Frame, Ready
from abeja_runtime.front.pending import PendingCall
from abeja_runtime.front.pool import HandlerPool
from abeja_runtime.front.processes import ProcessState

_pids = itertools.count(1000)


class FakePopen:
    def __init__(self) -> None:
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        assert self.returncode is not None, "a fake process exits only when told to"
        return self.returncode


class FakeProcess:
    """Stands for a HandlerProcess: records what the pool sends it."""

    def __init__(self, config: Config, environment: dict[str, str], pool: HandlerPool) -> None:
        self.pool = pool
        self.pid = next(_pids)
        self.popen = FakePopen()
        self.state = ProcessState.STARTING
        self.sent: dict[int, PendingCall] = {}
        self.frames: list[Frame] = []
        self.answered = 0
        self.answered_at = 0.0
        self.take_back_timer: asyncio.TimerHandle | None = None
        self.request_limit: int | None = None
        self.batches = 0
        self.retiring = False
        self.replaces: Any = None
        self.exit_fd: int | None = None
        self.loop = asyncio.get_running_loop()
        self.closed = False
        self.killed = False

    # what the pool calls
    def send(self, frame: Frame, fd: int | None = None) -> None:
        self.frames.append(frame)

    def close_socket(self) -> None:
        self.closed = True

    def kill(self) -> None:
        self.killed = True

    def signal(self, signum: int) -> None:
        pass

    def read_available(self) -> None:
        pass

    def oldest_call_age(self, now: float) -> float | None:
        for pending in self.sent.values():
            return now - pending.sent_at
        return None

    # what the test makes it do
    def ready(self) -> None:
        self.pool.received(self, Ready(VERSION, "abeja", (), ()), None)  # type: ignore[arg-type]

    def answer(self, call_id: int, status: int = 200) -> None:
        answer = Answer(call_id, status, (), b"ok", False)
        self.pool.received(self, answer, None)  # type: ignore[arg-type]

    def exit(self, code: int) -> None:
        self.popen.returncode = code
        self.pool.exited(self)  # type: ignore[arg-type]


class FakePool:
    """A pool of fake processes, and the processes it made, in order."""

    def __init__(self, **settings: Any) -> None:
        self.config = Config(**settings)
        self.made: list[FakeProcess] = []
        self.load_failed: list[str] = []

        def factory(config: Config, environment: dict[str, str], pool: HandlerPool) -> Any:
            process = FakeProcess(config, environment, pool)
            self.made.append(process)
            return process

        self.pool = HandlerPool(
            self.config,
            "/nonexistent-metrics-dir",
            lambda: None,
            lambda text, details: self.load_failed.append(text),
            process_factory=factory,
        )
        for _ in range(self.config.workers):
            self.pool._ensure_spawn()
