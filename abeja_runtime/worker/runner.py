"""Running the front's calls in a handler process: call frames in, answer frames out.

:meth:`Runner.dispatch` says which calls a frame read starts: a call alone (a batch of one), or
those a :class:`~abeja_runtime.frames.RunBatch` names. :meth:`Runner.run` runs them: the handler
invoked once for all (``invoke.py``), each answer written whole (in the frame, or a memfd above
the inline limit) or streamed as its credit allows (``credits.py``).
"""

from __future__ import annotations

import io
import logging
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from typing import IO, TYPE_CHECKING, Final, cast

from abeja_runtime.config import Config
from abeja_runtime.encode import UNEXPECTED_ERROR, EncodedResponse
from abeja_runtime.errors import CallCancelled, NotStartedInTime
from abeja_runtime.frames import (
    INLINE_LIMIT,
    Answer,
    BlockingChannel,
    Call,
    Cancel,
    Chunk,
    Client,
    End,
    Frame,
    GiveBack,
    GivenBack,
    RpcAnswer,
    RpcCall,
    RunBatch,
    header_text,
    memfd,
)
from abeja_runtime.logs import request_id_var, requester_id_var
from abeja_runtime.mapped import SharedBodies
from abeja_runtime.tracing import HandlerSpan, Tracing
from abeja_runtime.worker.cancellation import Cancellations
from abeja_runtime.worker.credits import StreamCredits
from abeja_runtime.worker.decode import decode_request
from abeja_runtime.worker.invoke import Invoker, chunks, close_stream, settled
from abeja_runtime.worker.request import Request

if TYPE_CHECKING:
    from abeja_runtime.worker.client_streams import ClientConnections

__all__ = ["Held", "Runner"]

_log = logging.getLogger("abeja_runtime")

#: A call as it was read: its frame, and the descriptor that came with it.
Held = tuple[Call | RpcCall, int | None]
_NO_SPANS: Final[dict[int, HandlerSpan]] = {}
#: A call with less time than this left before its latest start is not started: the handler
#: would start after it (the request is still to be built).
_LEAST_LEFT: Final = 0.001
#: gRPC's status code of a call whose deadline passed.
_DEADLINE_EXCEEDED: Final = 4
#: The answer of an interrupted call, which the front drops (it answered the call already).
_CANCELLED: Final = EncodedResponse(499, (), b"")


class Runner:
    """The front's calls, run on the executor's threads or loop."""

    def __init__(
        self,
        config: Config,
        invoker: Invoker,
        channel: BlockingChannel,
        cancellations: Cancellations,
        credits: StreamCredits,
        tracing: Tracing | None = None,
    ) -> None:
        self.channel = channel
        self._invoker = invoker
        self._cancellations = cancellations
        self.credits = credits
        self._shared = SharedBodies()
        #: Traced calls get their handler span (and their answers an encode span: the invoker's).
        self._tracing = tracing
        #: ``--cancel-raises``: a ``def`` handler is interrupted when its call is cancelled.
        self._interrupts = config.cancel_raises and not invoker.handler.is_async
        if self._interrupts:
            cancellations.raise_in_handlers()
        #: Calls run in batches (``--max-batch-size``); those read wait for their RunBatch here.
        self.batching = invoker.batched
        self._held: dict[int, tuple[Call, int | None]] = {}
        #: The executor's part of a :class:`Cancel` or :class:`GiveBack` (the event loop's).
        self.take_back: Callable[[int, bool], object] = lambda call_id, cancel: None
        #: The clients' connections handed over with the calls, when streams are written to
        #: them here (on an event loop: ``client_streams.py``).
        self.clients: ClientConnections | None = None
        self._limits = (config.stream_idle_timeout or None, config.stream_timeout or None)

    def calls(self) -> Iterator[list[Held]]:
        """The calls to run, as the frames read say, until the front closes the socket (then
        the streams waiting for credit stop)."""
        read, dispatch = self.channel.read, self.dispatch
        while (item := read()) is not None:
            calls = dispatch(item)
            if calls is not None:
                yield calls
        self.credits.close()

    def dispatch(self, item: tuple[Frame, int | None]) -> list[Held] | None:
        """The calls to run now for a frame read, or ``None``: a call held for its batch, a
        :class:`Cancel` or :class:`GiveBack` (told to :attr:`take_back`)."""
        frame = item[0]
        if type(frame) is Call or type(frame) is RpcCall:
            if type(frame) is Call and self.batching:
                self._held[frame.id] = (frame, item[1])
                return None
            self._cancellations.started(frame.id)
            return [item]  # type: ignore[list-item]  # a call's frame
        if type(frame) is RunBatch:
            held = self._held
            calls: list[Held] = [held.pop(call_id) for call_id in frame.ids if call_id in held]
            for call, _ in calls:
                self._cancellations.started(call.id)
            return calls or None
        if type(frame) is Cancel or type(frame) is GiveBack:
            self.take_back(frame.id, type(frame) is Cancel)
            return None
        if type(frame) is Client:
            if self.clients is not None:
                self.clients.take_in(frame, item[1])
            elif item[1] is not None:  # (never sent where streams are not written)
                os.close(item[1])
            return None
        raise AssertionError(f"a {type(frame).__name__} frame among the calls")

    async def run(self, calls: list[Held]) -> None:
        """Run ``calls``, one call of the handler for all of them, and write each one's answer
        (a call whose request cannot be built is answered alone, 400 or 413); each is over
        when this returns, its request closed."""
        frame, fd = calls[0]
        one = len(calls) == 1
        request_token = request_id_var.set(
            frame.request_id if one else ",".join(call.request_id for call, _ in calls)
        )
        requester_token = requester_id_var.set(
            frame.requester_id if one and type(frame) is Call else None
        )
        spans = _NO_SPANS if self._tracing is None else self._spans(calls)
        requests: list[Request] = []
        try:
            if type(frame) is RpcCall:
                await self._rpc(frame, fd, spans.get(frame.id))
                return
            ids = self._requests(calls, spans, requests)  # type: ignore[arg-type]  # Calls
            if not requests:
                return
            if self._interrupts and one:
                replies = await self._interruptible(ids[0], requests)
            else:
                replies = await self._invoker.answer(requests)
            for call_id, reply in zip(ids, replies):  # noqa: B905  # one reply per request
                if type(reply.body) is bytes:
                    self._whole(call_id, reply, spans.get(call_id))
                else:
                    await self._stream(call_id, reply, spans.get(call_id))
        finally:
            for request in requests:
                request.close()
            for held, _ in calls:
                self._over(held.id)
            if spans:
                for span in reversed(spans.values()):
                    span.__exit__()
            requester_id_var.reset(requester_token)
            request_id_var.reset(request_token)

    def _requests(
        self,
        calls: list[tuple[Call, int | None]],
        spans: dict[int, HandlerSpan],
        requests: list[Request],
    ) -> list[int]:
        """The calls' requests (each decoded in a span of its own, traced), into ``requests``,
        and their calls' ids; a call whose request cannot be built is answered now and left out,
        as is one past its latest start (``504``: its handler never starts too late to answer)."""
        ids: list[int] = []
        # A decode span is the current span's child: the call's own only when it is alone.
        decoding = spans if len(spans) < 2 else _NO_SPANS
        for call, fd in calls:
            span = decoding.get(call.id)
            if _too_late(call, fd):
                request: Request | EncodedResponse = self._invoker.error_reply(NotStartedInTime())
            elif span is None:
                request = self._decode(call, fd)
            else:
                with span.decode():
                    request = self._decode(call, fd)
            if type(request) is Request:
                request.watch_cancellation(self._cancellations, call.id)
                requests.append(request)
                ids.append(call.id)
            else:
                self._whole(call.id, request, spans.get(call.id))  # type: ignore[arg-type]
        return ids

    def _spans(self, calls: list[Held]) -> dict[int, HandlerSpan]:
        """The traced calls' handler spans, by id, begun and current from now (the handler's
        own spans are children of the last one)."""
        assert self._tracing is not None
        spans = {}
        for call, _ in calls:
            span = self._tracing.handler(call.trace, self._invoker.handler.name)
            if span is not None:
                spans[call.id] = span.__enter__()
        return spans

    def _decode(self, call: Call, fd: int | None) -> Request | EncodedResponse:
        body: IO[bytes]
        if fd is None:
            body = io.BytesIO(call.body or b"")
        elif not call.spool_path:  # the front's shared memory, read in place
            body = self._shared.open(fd, call.body_size)
        else:
            body = os.fdopen(fd, "rb")
            body.raw.name = call.spool_path  # type: ignore[attr-defined]
        try:
            return decode_request(
                method=call.method,
                raw_path=call.raw_path,
                raw_query=call.raw_query,
                headers=header_text(call.headers),
                body=body,
                limits=self._invoker.limits,
                request_id=call.request_id,
            )
        except Exception as exc:
            return self._invoker.error_reply(exc)

    async def _interruptible(self, call_id: int, requests: list[Request]) -> list[EncodedResponse]:
        """The handler's answer, or :data:`_CANCELLED` when it was interrupted."""
        cancellations = self._cancellations
        try:
            cancellations.interruptible(call_id)
            try:
                return await self._invoker.answer(requests)
            finally:
                cancellations.uninterruptible(call_id)
        except CallCancelled:
            cancellations.uninterruptible(call_id)  # raised before it could say so itself
            _log.info(
                "the handler %s was interrupted: nobody waits for its answer any more",
                self._invoker.handler.name,
            )
            return [_CANCELLED]

    async def _rpc(self, call: RpcCall, fd: int | None, span: HandlerSpan | None) -> None:
        rpc = self._invoker.handler.rpc
        assert rpc is not None, "the front sends gRPC calls only to styles that have them"
        if _too_late(call, fd):
            late = NotStartedInTime()
            self.channel.write(RpcAnswer(call.id, _DEADLINE_EXCEEDED, b"", late.message, 504))
            return
        payload = call.payload
        if fd is not None:  # the message in the front's shared memory: one copy, to parse it
            with self._shared.open(fd, call.size) as message:
                payload = message.read()
        answer = RpcAnswer(call.id, *await settled(rpc.call(call.method, payload, call.metadata)))
        if span is not None:
            span.status(answer.http_status)
            span.end()
        if len(answer.payload) <= INLINE_LIMIT:
            self.channel.write(answer)
        else:
            self._write_memfd(answer._replace(payload=b""), answer.payload)

    def _whole(self, call_id: int, reply: EncodedResponse, span: HandlerSpan | None) -> None:
        if span is not None:
            span.status(reply.status)
            span.end()
        body = reply.body
        assert type(body) is bytes
        if len(body) <= INLINE_LIMIT:
            failed = reply is UNEXPECTED_ERROR
            self.channel.write(Answer(call_id, reply.status, reply.headers, body, False, failed))
        else:
            self._write_memfd(Answer(call_id, reply.status, reply.headers, None, False), body)

    async def _stream(self, call_id: int, reply: EncodedResponse, span: HandlerSpan | None) -> None:
        """The streamed answer: written to its client here when the front lent its connection
        (``client_streams.py``), else sent to the front; the span ends with it."""
        if span is not None:
            span.status(reply.status)
        body = chunks(cast("Iterator[bytes] | AsyncIterator[bytes]", reply.body))
        clients = self.clients
        try:
            if clients is None or not await clients.write(
                call_id, reply, body, self.channel, self._cancellations, self._limits
            ):
                await self._send_stream(call_id, reply, body)
        finally:
            if span is not None:
                span.end()

    async def _send_stream(
        self, call_id: int, reply: EncodedResponse, body: AsyncGenerator[bytes, None]
    ) -> None:
        """The head, each chunk as the generator yields it and the credit allows, then the
        :class:`End`; stopped, the generator closed, once the call is cancelled."""
        credits = self.credits
        credits.open(call_id)
        self.channel.write(Answer(call_id, reply.status, reply.headers, None, True))
        failed = True  # until the loop ends: by an error, or its task cancelled
        try:
            async for chunk in body:
                size = len(chunk)
                if size and not (credits.spend(call_id, size) or await credits.take(call_id, size)):
                    break
                if self._cancellations.is_cancelled(call_id):
                    break
                if size > INLINE_LIMIT:  # as a memfd: never whole in the front's memory
                    self._write_memfd(Chunk(call_id, None), chunk)
                elif chunk:
                    self.channel.write(Chunk(call_id, bytes(chunk)))
            failed = False
        except Exception as exc:
            # Headers are out: the front can only cut the chunked body short.
            _log.error("the handler's streamed content failed after the response began: %s", exc)
        finally:
            credits.finished(call_id)
            try:
                await close_stream(body)
            finally:  # else the front would wait for it, and keep its slot, for good
                self.channel.write(End(call_id, failed))

    def _write_memfd(self, frame: Frame, data: bytes) -> None:
        fd = memfd([data])
        try:
            self.channel.write(frame, fd)
        finally:
            os.close(fd)

    def _over(self, call_id: int) -> None:
        """Call ``call_id`` is over here: what it held is let go."""
        self._cancellations.finished(call_id)
        if self.clients is not None:
            self.clients.drop(call_id)

    def give_back(self, frame: Call | RpcCall, fd: int | None) -> None:
        """Tell the front that ``frame`` was not run (it sends it elsewhere, or drops it)."""
        if fd is not None:
            os.close(fd)
        self._over(frame.id)
        self.channel.write(GivenBack(frame.id))

    def dropped(self, frame: Call | RpcCall) -> None:
        """The answer to a call whose task was cancelled, which only frees its slot."""
        if type(frame) is Call:
            self.channel.write(Answer(frame.id, 504, (), b"", False))
        else:
            self.channel.write(RpcAnswer(frame.id, _DEADLINE_EXCEEDED, b"", "cancelled", 504))


def _too_late(call: Call | RpcCall, fd: int | None) -> bool:
    """Whether ``call`` is past its latest start (or less than :data:`_LEAST_LEFT` before it);
    then its body's descriptor, never to be read, is closed."""
    late = bool(call.start_by) and time.time() + _LEAST_LEFT >= call.start_by
    if late and fd is not None:
        os.close(fd)
    return late
