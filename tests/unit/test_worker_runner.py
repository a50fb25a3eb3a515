"""The worker's one shape of call, without a process or a socket: :func:`settled` and
:func:`finish` (where ``def`` and ``async def`` meet), :func:`chunks` (a stream, sync or async),
and the runner's dispatch and run against a channel that keeps what is written."""

from __future__ import annotations

import asyncio
import inspect
import json
from typing import Any

from abeja_runtime.config import Config
from abeja_runtime.frames import Answer, Call, Cancel, Chunk, End, GiveBack, RunBatch
from abeja_runtime.styles import LoadedHandler
from abeja_runtime.worker.cancellation import Cancellations
from abeja_runtime.worker.credits import StreamCredits
from abeja_runtime.worker.invoke import Invoker, chunks, finish, settled
from abeja_runtime.worker.runner import Runner


class Channel:
    def __init__(self) -> None:
        self.written: list[Any] = []
        self.frames: list[Any] = []

    def read(self) -> Any:
        return self.frames.pop(0) if self.frames else None

    def write(self, frame: Any, fd: int | None = None) -> None:
        self.written.append(frame)


def runner(func: Any, **settings: Any) -> tuple[Runner, Channel]:
    config = Config(handler="main:handler", **settings)
    handler = LoadedHandler(func=func, is_async=inspect.iscoroutinefunction(func), name="t")
    cancellations = Cancellations()
    channel = Channel()
    credits = StreamCredits(cancellations)
    invoker = Invoker(config, handler)
    return Runner(config, invoker, channel, cancellations, credits), channel  # type: ignore[arg-type]


def call(call_id: int, body: bytes = b'{"n": 1}') -> tuple[Call, None]:
    headers = ((b"Content-Type", b"application/json"),)
    return Call(call_id, "POST", "/", "", headers, f"r{call_id}", None, body, "", len(body)), None


def test_settled_returns_a_value_and_awaits_an_awaitable_where_no_loop_runs() -> None:
    async def twice(value: int) -> int:
        await asyncio.sleep(0.001)  # needs a loop: this thread's own
        return value * 2

    assert finish(settled({"a": 1})) == {"a": 1}
    assert finish(settled(twice(2))) == 4


def test_chunks_close_a_generator_the_reader_left_sync_or_async() -> None:
    closed = []

    def lines() -> Any:
        try:
            yield from (b"a", b"b", b"c")
        finally:
            closed.append("sync")

    async def async_lines() -> Any:
        try:
            for line in (b"a", b"b", b"c"):
                await asyncio.sleep(0)
                yield line
        finally:
            closed.append("async")

    async def first(body: Any) -> bytes:
        stream = chunks(body)
        async for chunk in stream:
            await stream.aclose()
            return chunk
        raise AssertionError("no chunk")

    assert finish(first(lines())) == b"a"
    assert finish(first(async_lines())) == b"a"
    assert closed == ["sync", "async"]


def test_a_call_alone_runs_as_a_batch_of_one() -> None:
    def handler(request: Any, context: Any) -> dict[str, Any]:
        return {"content": {"doubled": json.load(request)["n"] * 2}}

    run, channel = runner(handler)
    calls = run.dispatch(call(1))
    assert calls is not None and len(calls) == 1
    finish(run.run(calls))
    (answer,) = channel.written
    assert isinstance(answer, Answer) and answer.status == 200
    assert json.loads(answer.body or b"") == {"doubled": 2}


def test_batched_calls_wait_for_their_run_batch_and_are_answered_each() -> None:
    def handler(requests: list[Any], context: Any) -> list[dict[str, Any]]:
        return [
            {"content": {"n": json.load(request)["n"], "of": len(requests)}} for request in requests
        ]

    run, channel = runner(handler, max_batch_size=4)
    assert run.dispatch(call(1, b'{"n": 1}')) is None
    assert run.dispatch(call(2, b'{"n": 2}')) is None
    calls = run.dispatch((RunBatch((1, 2)), None))
    assert calls is not None
    finish(run.run(calls))
    bodies = {frame.id: json.loads(frame.body) for frame in channel.written}
    assert bodies == {1: {"n": 1, "of": 2}, 2: {"n": 2, "of": 2}}


def test_a_stream_is_written_chunk_by_chunk_and_ended() -> None:
    def handler(request: Any, context: Any) -> dict[str, Any]:
        return {"content_type": "text/plain", "content": iter([b"a", b"", b"b"])}

    run, channel = runner(handler)
    calls = run.dispatch(call(1))
    assert calls is not None
    finish(run.run(calls))
    head, *rest = channel.written
    assert isinstance(head, Answer) and head.streamed
    assert rest == [Chunk(1, b"a"), Chunk(1, b"b"), End(1, False)]


def test_cancels_and_give_backs_go_to_the_executor() -> None:
    run, _ = runner(lambda request, context: {})
    taken: list[tuple[int, bool]] = []
    run.take_back = lambda call_id, cancel: taken.append((call_id, cancel))
    assert run.dispatch((Cancel(3), None)) is None
    assert run.dispatch((GiveBack(4), None)) is None
    assert taken == [(3, True), (4, False)]


def test_calls_are_read_until_the_front_closes_the_socket_then_streams_stop_waiting() -> None:
    run, channel = runner(lambda request, context: {})
    channel.frames = [call(1), (Cancel(1), None), call(2)]
    assert [[frame.id for frame, _ in calls] for calls in run.calls()] == [[1], [2]]
    assert finish(run.credits.take(9, 1)) is False  # closed: no wait for credit that never comes
