"""Fakes for the pool's unit tests: handler processes without a process behind them (what the
pool sees of one: its pid, its frames, its exit), and a clock the test moves."""

from __future__ import annotations

import itertools
from typing import Any

from abeja_runtime.config import Config
from abeja_runtime.frames import VERSION, Answer, Frame, Ready
from abeja_runtime.front.pending import Member
from abeja_runtime.front.pool import HandlerPool

_pids = itertools.count(1000)


class FakeClock:
    """The scheduler's clock: it moves only when the test moves it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeChild:
    def __init__(self) -> None:
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        assert self.returncode is not None, "a fake process exits only when told to"
        return self.returncode


class FakeProcess:
    """Stands for a HandlerProcess: records what the pool sends it."""

    def __init__(self, pool: HandlerPool, sink: Member) -> None:
        self.pool = pool
        self.sink = sink
        self.pid = next(_pids)
        self.child = FakeChild()
        self.device: str | None = None
        self.exit_fd: int | None = None
        self.frames: list[Frame] = []
        self.closed = False
        self.killed = False

    # what the pool calls
    def send(self, frame: Frame, fd: int | None = None) -> None:
        self.frames.append(frame)

    def close_socket(self) -> None:
        self.closed = True

    def kill(self) -> None:
        self.killed = True

    def read_available(self) -> None:
        pass

    # what the test makes it do
    def ready(self) -> None:
        self.sink.received(Ready(VERSION, "abeja", (), ()), None)

    def answer(self, call_id: int, status: int = 200) -> None:
        self.sink.received(Answer(call_id, status, (), b"ok", False), None)

    def exit(self, code: int) -> None:
        self.child.returncode = code
        self.sink.exited()


class FakePool:
    """A pool of fake processes on a fake clock, and the processes it made, in order."""

    def __init__(self, **settings: Any) -> None:
        self.config = Config(**settings)
        self.made: list[FakeProcess] = []
        self.load_failed: list[str] = []
        self.clock = FakeClock()

        def factory(config: Config, environment: dict[str, str], sink: Any) -> Any:
            process = FakeProcess(self.pool, sink)
            self.made.append(process)
            return process

        self.pool = HandlerPool(
            self.config,
            "/nonexistent-metrics-dir",
            lambda: None,
            lambda text, details: self.load_failed.append(text),
            process_factory=factory,
            clock=self.clock,
        )
        for _ in range(self.config.workers):
            self.pool.lifecycle.spawn()


class FakeResponder:
    """A call's responder that records what it was asked to write, and finishes the call as a
    way in does once its answer is out."""

    def __init__(self) -> None:
        self.written: list[Any] = []

    def answer(self, call: Any, answer: Any) -> None:
        self.written.append(answer)
        call.finish()

    def refuse(self, call: Any, exc: Any) -> None:
        self.written.append(exc)
        call.finish()
