"""A handler process: load the handler, then answer the front's calls, each before the next.

``python -m abeja_runtime.worker FD FRONT_PID``, started by the front (``front/processes.py``) with
its end of a socket pair, on which frames travel (``frames.py``). This process imports no HTTP
server: it reads a :class:`~abeja_runtime.frames.Call`, builds the ABEJA request from it, calls
the handler, encodes the result and writes the :class:`~abeja_runtime.frames.Answer`, and (on
the main thread, a ``def`` handler at ``--concurrency 1``) only then reads the next call. A
crash (``os._exit``, a segfault, the OOM killer) can therefore lose only the calls that were
running: every finished answer is in the socket already, and the calls the front had sent but
this process had not started are still the front's to give to another process.

How calls run, by the handler:

* a ``def`` handler with ``--concurrency 1`` (the default): on the main thread, the thread that
  imported the handler module, one after the other;
* a ``def`` handler with ``--concurrency N``: on N threads, each writing its own answers;
* an ``async def`` handler: on this process's event loop, at most N at once.

Deadlines, admission and every decision about this process's life are the front's: it answers
``504`` when a call is late and kills this process when the call is still running long after.
SIGTERM and SIGINT are ignored (the front decides when to stop); the front closing the socket
means "stop": the handler's teardown (KServe's ``Model.stop()``) runs, and the process exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import inspect
import io
import logging
import os
import queue
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import IO, Any, Final, NoReturn

from abeja_runtime.batched import declared_batch
from abeja_runtime.config import Config
from abeja_runtime.encode import UNEXPECTED_ERROR, EncodedResponse
from abeja_runtime.errors import CallCancelled, HandlerLoadError
from abeja_runtime.frames import (
    EXIT_WARMUP_FAILED,
    INLINE_LIMIT,
    VERSION,
    Answer,
    BlockingChannel,
    Call,
    Cancel,
    Chunk,
    End,
    Frame,
    GivenBack,
    LoadFailed,
    ProtocolError,
    Ready,
    RpcAnswer,
    RpcCall,
    RunBatch,
    Start,
    header_text,
    memfd,
)
from abeja_runtime.logs import (
    capture_prints,
    configure_logging,
    request_id_var,
    requester_id_var,
    user_traceback,
)
from abeja_runtime.mapped import SharedBodies
from abeja_runtime.pixels import limit_image_pixels
from abeja_runtime.scheduling import run_as_batch
from abeja_runtime.styles import LoadedHandler
from abeja_runtime.tracing import HandlerSpan, Tracing, tracing_from
from abeja_runtime.worker.calls import HandlerCalls
from abeja_runtime.worker.cancellation import Cancellations
from abeja_runtime.worker.credits import StreamCredits
from abeja_runtime.worker.loader import load_handler
from abeja_runtime.worker.request import Request
from abeja_runtime.worker.warmup import Warmup, WarmupFailed

__all__ = ["main"]

_log = logging.getLogger("abeja_runtime")
#: prctl(PR_SET_PDEATHSIG): the kernel kills this process when the front dies, whatever the
#: handler is doing (a socket closed by a dead front is only noticed between calls).
_PR_SET_PDEATHSIG: Final = 1
#: How often a ``def`` handler's process looks whether its call is slow, and then gives back
#: the calls the front takes back (the front asks for them 50 ms into a call).
_SLOW_CALL_LOOK: Final = 0.02


def main() -> None:
    """Process entry point; ``os._exit`` at the end, so that a handler thread cannot hold it."""
    fd, front = int(sys.argv[1]), int(sys.argv[2])
    os.set_inheritable(fd, False)  # the handler's own subprocesses do not get it
    _leave_stopping_to_the_front()
    _die_with(front)
    run_as_batch()
    cancellations = Cancellations()
    credits = StreamCredits()

    def cancelled(call_id: int) -> None:
        cancellations.cancel(call_id)
        credits.stop_waiting(call_id)

    channel = BlockingChannel(socket.socket(fileno=fd), _channel_broken, cancelled, credits.grant)
    first = channel.read()
    start = first[0] if first is not None else None
    if not isinstance(start, Start) or start.version != VERSION:
        os._exit(2)  # not started by a front of this version
    config = start.config
    configure_logging(config.log_level, config.platform.log_fields(), log_format=config.log_format)
    capture_prints()
    limit_image_pixels(config.max_image_pixels)
    # Before the handler is imported: its own tracer provider is this one.
    tracing = tracing_from(os.environ, "worker")
    try:
        code = _serve(config, channel, cancellations, credits, tracing)
    except Exception:
        _log.exception("the worker failed")
        code = 1
    if tracing is not None:
        tracing.shutdown()  # its spans still buffered go out
    logging.shutdown()
    os._exit(code)


def _channel_broken(exc: ProtocolError) -> NoReturn:
    """What arrives from the front cannot be read any more (most often: the handler has used
    up this process's open files, so the descriptor of a request's body could not be
    received). Said in the log, then the process ends, on whichever thread found it: the
    front answers its calls 502 and starts a fresh process."""
    _log.error("the worker stops: %s", exc)
    logging.shutdown()
    os._exit(_EXIT_CHANNEL_BROKEN)


#: The exit code of a worker whose channel broke (EX_PROTOCOL of sysexits.h).
_EXIT_CHANNEL_BROKEN: Final = 76


def _leave_stopping_to_the_front() -> None:
    """SIGTERM and SIGINT (a Ctrl-C reaches the whole process group) do nothing here: the front
    drains, then closes this process's socket. A handler that does nothing rather than
    ``SIG_IGN``, which the handler's own subprocesses would inherit through fork and exec
    (their ``terminate()`` did nothing); a handler is reset to the default by exec, and by
    the hook below in a child forked from Python (multiprocessing's)."""
    for signum in _STOP_SIGNALS:
        signal.signal(signum, _do_nothing)
    os.register_at_fork(after_in_child=_default_stop_signals)


_STOP_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT)


def _do_nothing(signum: int, frame: object) -> None:
    pass


def _default_stop_signals() -> None:
    for signum in _STOP_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # KeyboardInterrupt, as usual


def _die_with(front: int) -> None:
    """Be killed by the kernel when the front dies (in a container the front may be pid 1)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != front:  # the front died before the line above
        os._exit(1)


def _serve(
    config: Config,
    channel: BlockingChannel,
    cancellations: Cancellations,
    credits: StreamCredits,
    tracing: Tracing | None,
) -> int:
    loading = time.monotonic()
    try:
        handler = load_handler(config.handler, Path.cwd(), config)
    except Exception as exc:
        details = "" if isinstance(exc, HandlerLoadError) else traceback.format_exc()
        if isinstance(exc, HandlerLoadError) and exc.__cause__ is not None:
            details = user_traceback(exc.__cause__)
        channel.write(LoadFailed(str(exc), details))
        return 1
    batch = declared_batch(handler.func) if config.max_batch_size == 1 else None
    if batch is not None:  # @abeja_runtime.batched, the settings silent
        config = dataclasses.replace(config, max_batch_size=batch[0], max_batch_wait=batch[1])
    if config.max_batch_size > 1 and handler.style != "abeja":
        channel.write(
            LoadFailed(
                f"--max-batch-size (ABEJA_RUNTIME_MAX_BATCH_SIZE) batches requests for a "
                f"handler(requests, context) function of the abeja style; {handler.name} is "
                f"served with the {handler.style} style, which takes one request a call: "
                "leave --max-batch-size at 1",
                "",
            )
        )
        return 1
    rpc_methods = handler.rpc.methods if handler.rpc is not None else ()
    ready = Ready(VERSION, handler.style, handler.front_paths, rpc_methods, batch)
    handler_calls = HandlerCalls(config, handler)
    calls = _Calls(config, handler_calls, channel, cancellations, credits)
    if tracing is not None:
        calls.trace(tracing)
    # Ready once warm (the warm-up says it), on the thread or the loop that runs the calls.
    warmup = Warmup(config, handler_calls, channel, ready, time.monotonic() - loading)
    code = 0
    try:
        if handler.is_async or (handler.rpc is not None and handler.rpc.is_async):
            from abeja_runtime.worker.handler_loop import serve_on_loop  # asyncio only then

            serve_on_loop(calls, config.concurrency, config.event_loop, warmup.run_async)
        elif config.concurrency == 1:
            warmup.run()
            calls.reads_itself = True
            watch = _SlowCallWatch(calls)
            while (item := channel.read()) is not None:
                watch.calls_started += 1
                watch.in_call = True
                calls.run(*item)
                watch.in_call = False
            watch.stop()
        else:
            warmup.run()
            _serve_on_threads(calls, config.concurrency)
    except WarmupFailed as exc:
        _log.error("%s", exc)
        code = EXIT_WARMUP_FAILED
    _stop_handler(handler, config)
    return code


class _SlowCallWatch:
    """While a ``def`` handler's call runs on the main thread, nothing reads the socket: this
    thread does, once the call has run for :data:`_SLOW_CALL_LOOK`, and gives back the calls
    waiting behind it that the front takes back (:class:`~abeja_runtime.frames.GiveBack`).

    The main thread only counts its calls: no lock, clock or system call per call."""

    def __init__(self, calls: _Calls) -> None:
        self.calls_started = 0
        self.in_call = False
        self._calls = calls
        self._stopped = threading.Event()
        threading.Thread(target=self._run, name="abeja-slow-call-watch", daemon=True).start()

    def _run(self) -> None:
        seen = -1
        while not self._stopped.wait(_SLOW_CALL_LOOK):
            started = self.calls_started
            if self.in_call and started == seen:  # the same call as a look ago
                for frame, fd in self._calls.channel.taken_back():
                    self._calls.give_back(frame, fd)
            seen = started

    def stop(self) -> None:
        self._stopped.set()


def _serve_on_threads(calls: _Calls, threads: int) -> None:
    """``threads`` handler threads, fed in the order the calls came."""
    jobs: queue.SimpleQueue[tuple[Frame, int | None] | None] = queue.SimpleQueue()

    def work() -> None:
        while (job := jobs.get()) is not None:
            calls.run(*job)

    pool = [threading.Thread(target=work, name=f"abeja-handler-{i}") for i in range(threads)]
    for thread in pool:
        thread.start()
    while (item := calls.channel.read()) is not None:
        match item[0]:
            case Call() as call if calls.batched:  # run with its batch (RunBatch)
                calls.hold(call, item[1])
                continue
            case Call(id=call_id) | RpcCall(id=call_id):
                calls.cancellations.started(call_id)
            case Cancel():  # said to the call as it was read (BlockingChannel)
                continue
        jobs.put(item)
    calls.front_gone()
    for _ in pool:
        jobs.put(None)
    for thread in pool:
        thread.join()


def _stop_handler(handler: LoadedHandler, config: Config) -> None:
    """The style's teardown after the last call; a failure is only logged."""
    if handler.stop is None:
        return
    try:
        result = handler.stop()
        if inspect.isawaitable(result):
            from abeja_runtime.worker.handler_loop import run_until_done  # asyncio only when needed

            run_until_done(result)
    except Exception:
        _log.exception("stopping the handler %s failed", handler.name)


class _Calls:
    """Frames in, the handler's answers out."""

    def __init__(
        self,
        config: Config,
        calls: HandlerCalls,
        channel: BlockingChannel,
        cancellations: Cancellations,
        credits: StreamCredits,
    ) -> None:
        self.channel = channel
        self.cancellations = cancellations
        self.credits = credits
        #: This process's main thread reads the frames itself, between the calls it runs (a
        #: ``def`` handler at ``--concurrency 1``): a stream waiting for credit reads them.
        self.reads_itself = False
        self._raise_cancelled = config.cancel_raises and not calls.handler.is_async
        if self._raise_cancelled:
            cancellations.raise_in_handlers()
        self._calls = calls
        self._handler = calls.handler
        self._shared = SharedBodies()
        #: Batch mode (``--max-batch-size``): the calls come first, then :class:`RunBatch`
        #: says which run together; until then they are held here.
        self.batched = calls.batched
        self._held: dict[int, tuple[Call, int | None]] = {}
        #: Each traced call's handler span (:mod:`abeja_runtime.tracing`), when tracing is on.
        self.tracing: Tracing | None = None

    def trace(self, tracing: Tracing) -> None:
        """Traced calls get their handler span, and their answers an encode span."""
        self.tracing = tracing
        self._calls.trace_encoding(tracing)

    def hold(self, frame: Call, fd: int | None) -> None:
        """A call of a batch still to come (see :attr:`batched`)."""
        self._held[frame.id] = (frame, fd)

    def _batch_of(self, run: RunBatch) -> list[tuple[Call, int | None]]:
        return [self._held.pop(call_id) for call_id in run.ids if call_id in self._held]

    def run(self, frame: Frame, fd: int | None) -> None:
        """One call, on this thread (a ``def`` handler)."""
        if self.batched:
            if isinstance(frame, Call):
                self.hold(frame, fd)
            elif isinstance(frame, RunBatch):
                self._run_batch(self._batch_of(frame))
            return
        if isinstance(frame, Call):
            with _RequestIds(frame.request_id, frame.requester_id, self._span(frame)) as span:
                request = self._request(frame, fd, span)
                if isinstance(request, EncodedResponse):  # none could be built from the call
                    self.cancellations.finished(frame.id)  # handed to a thread, maybe
                    self._send(frame.id, request, span)
                    return
                cancellations = self.cancellations
                cancellations.started(frame.id)
                request.watch_cancellation(cancellations, frame.id)
                try:
                    if self._raise_cancelled:
                        reply = self._answer_interruptible(frame.id, request)
                    else:
                        reply = self._calls.answer(request)
                    self._send(frame.id, reply, span)
                finally:
                    cancellations.finished(frame.id)
                    request.close()
        elif isinstance(frame, RpcCall):
            with _RequestIds(frame.request_id, None, self._span(frame)) as span:
                try:
                    result = self._rpc(frame, fd)
                finally:
                    self.cancellations.finished(frame.id)  # handed to a thread, maybe
                assert isinstance(result, tuple), "a sync style answers at once"
                self._send_rpc(RpcAnswer(frame.id, *result), span)

    async def run_async(self, frame: Frame, fd: int | None) -> None:
        """One call (or a batch of them), on this process's event loop."""
        if isinstance(frame, RunBatch):
            await self._run_batch_async(self._batch_of(frame))
        elif isinstance(frame, Call):
            with _RequestIds(frame.request_id, frame.requester_id, self._span(frame)) as span:
                request = self._request(frame, fd, span)
                if isinstance(request, EncodedResponse):
                    self._send(frame.id, request, span)
                    return
                cancellations = self.cancellations
                cancellations.started(frame.id)
                request.watch_cancellation(cancellations, frame.id)
                try:
                    if self._handler.is_async:
                        reply = await self._calls.answer_async(request)
                    else:
                        reply = self._calls.answer(request)
                    if isinstance(reply.body, AsyncIterator):
                        if span is not None:
                            span.status(reply.status)
                        await self._send_async(frame.id, reply)
                    else:
                        self._send(frame.id, reply, span)
                finally:
                    cancellations.finished(frame.id)
                    request.close()
        elif isinstance(frame, RpcCall):
            with _RequestIds(frame.request_id, None, self._span(frame)) as span:
                result = self._rpc(frame, fd)
                if inspect.isawaitable(result):
                    result = await result
                self._send_rpc(RpcAnswer(frame.id, *result), span)

    def _batch_requests(
        self, items: list[tuple[Call, int | None]], spans: dict[int, HandlerSpan]
    ) -> tuple[list[int], list[Request]]:
        """The requests of a batch's calls, each watched for its cancellation; a call whose
        request cannot be built is answered alone (400, 413) and left out."""
        ids: list[int] = []
        requests: list[Request] = []
        for frame, fd in items:
            with _RequestIds(frame.request_id, frame.requester_id):
                request = self._request(frame, fd)
            if isinstance(request, EncodedResponse):
                self._send(frame.id, request, spans.get(frame.id))
                continue
            self.cancellations.started(frame.id)
            request.watch_cancellation(self.cancellations, frame.id)
            ids.append(frame.id)
            requests.append(request)
        return ids, requests

    def _batch_over(self, ids: list[int], requests: list[Request]) -> None:
        for call_id, request in zip(ids, requests, strict=True):
            self.cancellations.finished(call_id)
            request.close()

    def _batch_spans(
        self, items: list[tuple[Call, int | None]], stack: contextlib.ExitStack
    ) -> dict[int, HandlerSpan]:
        """The handler spans of a batch's traced calls, by call id, each begun now and ended
        with ``stack``: the batch's one handler call is in every call's trace (the last one's
        span is current while it runs, the parent of the handler's own spans)."""
        spans = {}
        for frame, _ in items:
            span = self._span(frame)
            if span is not None:
                spans[frame.id] = stack.enter_context(span)
        return spans

    @contextlib.contextmanager
    def _batch(
        self, items: list[tuple[Call, int | None]]
    ) -> Iterator[tuple[dict[int, HandlerSpan], list[int], list[Request]]]:
        """A batch's handler spans, and the ids and requests of its calls that run; each
        request closed and each span ended afterwards."""
        with contextlib.ExitStack() as stack:
            spans = self._batch_spans(items, stack)
            ids, requests = self._batch_requests(items, spans)
            try:
                yield spans, ids, requests
            finally:
                self._batch_over(ids, requests)

    def _run_batch(self, items: list[tuple[Call, int | None]]) -> None:
        """One call of a batched ``def`` handler for the batch; each call answered alone."""
        with self._batch(items) as (spans, ids, requests):
            if not requests:
                return
            with _RequestIds(_batch_request_id(requests), None):
                replies = self._calls.answer_batch(requests)
                for call_id, reply in zip(ids, replies, strict=True):
                    self._send(call_id, reply, spans.get(call_id))

    async def _run_batch_async(self, items: list[tuple[Call, int | None]]) -> None:
        """:meth:`_run_batch` on the event loop (an ``async def`` batched handler)."""
        with self._batch(items) as (spans, ids, requests):
            if not requests:
                return
            with _RequestIds(_batch_request_id(requests), None):
                # On the loop a batched handler is async: batching is the abeja style's,
                # which has no async gRPC service to bring a def handler here.
                replies = await self._calls.answer_batch_async(requests)
                for call_id, reply in zip(ids, replies, strict=True):
                    span = spans.get(call_id)
                    if isinstance(reply.body, AsyncIterator):
                        if span is not None:
                            span.status(reply.status)
                        await self._send_async(call_id, reply)
                    else:
                        self._send(call_id, reply, span)

    def _rpc(self, call: RpcCall, fd: int | None) -> Any:
        rpc = self._handler.rpc
        assert rpc is not None, "the front sends gRPC calls only to styles that have them"
        payload = call.payload
        if fd is not None:  # the message in the front's shared memory: one copy, to parse it
            with self._shared.open(fd, call.size) as message:
                payload = message.read()
        return rpc.call(call.method, payload, call.metadata)

    def _send_rpc(self, answer: RpcAnswer, span: HandlerSpan | None = None) -> None:
        """The answer's message in the frame, or above the inline limit as a memfd."""
        if span is not None:
            span.status(answer.http_status)
        if len(answer.payload) <= INLINE_LIMIT:
            self.channel.write(answer)
            return
        fd = memfd([answer.payload])
        try:
            self.channel.write(answer._replace(payload=b""), fd)
        finally:
            os.close(fd)

    def front_gone(self) -> None:
        """The front closed the socket: streams waiting for credit stop."""
        self.credits.close()

    def give_back(self, frame: Call | RpcCall, fd: int | None) -> None:
        """Tell the front that ``frame`` was not run (it sends it elsewhere, or drops it)."""
        if fd is not None:
            os.close(fd)
        self.channel.write(GivenBack(frame.id))

    def dropped(self, frame: Call | RpcCall) -> None:
        """The answer to a call that was cancelled: the front has answered it already and
        drops this; it only frees the call's slot there."""
        if isinstance(frame, Call):
            self.channel.write(Answer(frame.id, 504, (), b"", False))
        else:
            self.channel.write(RpcAnswer(frame.id, 4, b"", "cancelled", 504))

    def _span(self, frame: Call | RpcCall) -> HandlerSpan | None:
        """The handler span of ``frame``'s call, from now, when it is traced."""
        tracing = self.tracing
        if tracing is None or not frame.trace:
            return None
        return tracing.handler(frame.trace, self._handler.name)

    def _request(
        self, call: Call, fd: int | None, span: HandlerSpan | None = None
    ) -> Request | EncodedResponse:
        """The handler's request, or the error reply when none can be built from the call;
        in a span of its own when the call is traced."""
        if span is None:
            return self._build_request(call, fd)
        with span.decode():
            return self._build_request(call, fd)

    def _build_request(self, call: Call, fd: int | None) -> Request | EncodedResponse:
        body: IO[bytes]
        if fd is None:
            body = io.BytesIO(call.body or b"")
        elif not call.spool_path:  # the front's shared memory, read in place
            body = self._shared.open(fd, call.body_size)
        else:
            body = os.fdopen(fd, "rb")
            body.raw.name = call.spool_path  # type: ignore[attr-defined]
        try:
            return self._calls.request(
                method=call.method,
                raw_path=call.raw_path,
                raw_query=call.raw_query,
                headers=header_text(call.headers),
                body=body,
                request_id=call.request_id,
            )
        except Exception as exc:
            return self._calls.error_reply(exc)

    def _send(self, call_id: int, reply: EncodedResponse, span: HandlerSpan | None = None) -> None:
        """The answer, written whole (a streamed body chunk by chunk) before this returns;
        its status on the call's handler span."""
        if span is not None:
            span.status(reply.status)
        body = reply.body
        if isinstance(body, bytes):
            if len(body) <= INLINE_LIMIT:
                failed = reply is UNEXPECTED_ERROR
                self.channel.write(
                    Answer(call_id, reply.status, reply.headers, body, False, failed)
                )
                return
            fd = memfd([body])
            try:
                self.channel.write(Answer(call_id, reply.status, reply.headers, None, False), fd)
            finally:
                os.close(fd)
            return
        if isinstance(body, AsyncIterator):  # a def handler's async generator: on a loop here
            from abeja_runtime.worker.handler_loop import run_until_done  # asyncio only then

            run_until_done(self._send_async(call_id, reply))
            return
        self.credits.open(call_id)
        self.channel.write(Answer(call_id, reply.status, reply.headers, None, True))
        failed = False
        try:
            for chunk in body:
                if not self._credit_for(call_id, chunk) or not self._pass_on(call_id, chunk):
                    break
        except Exception as exc:
            failed = _stream_failed(exc)
        finally:
            self.credits.finished(call_id)
            close = getattr(body, "close", None)
            if callable(close):
                close()  # the generator's finally runs now, also when it was stopped early
        self.channel.write(End(call_id, failed))

    def _answer_interruptible(self, call_id: int, request: Request) -> EncodedResponse:
        """The handler's answer, or :data:`_CANCELLED` when it was interrupted
        (``--cancel-raises``): the front answered the call already, and drops this."""
        cancellations = self.cancellations
        try:
            cancellations.interruptible(call_id)
            try:
                return self._calls.answer(request)
            finally:
                cancellations.uninterruptible(call_id)
        except CallCancelled:
            cancellations.uninterruptible(call_id)  # raised before it could say so itself
            _log.info(
                "the handler %s was interrupted: nobody waits for its answer any more",
                self._handler.name,
            )
            return _CANCELLED

    def _credit_for(self, call_id: int, chunk: bytes) -> bool:
        """Spend a chunk's credit, waiting for it (blocking this thread) while the client has
        not taken the chunks before; ``False`` when the call was cancelled or the front is
        gone meanwhile."""
        credits = self.credits
        cancellations = self.cancellations
        while chunk and not credits.spend(call_id, len(chunk)):
            if cancellations.is_cancelled(call_id) or credits.closed:
                return False
            if not self.reads_itself:
                credits.wait(call_id, lambda: cancellations.is_cancelled(call_id))
            elif not self.channel.wait_until(
                lambda: credits.has_credit(call_id) or cancellations.is_cancelled(call_id),
                self.give_back,
            ):
                credits.close()
        return True

    async def _credit_for_async(self, call_id: int, chunk: bytes) -> bool:
        """:meth:`_credit_for` for a stream on an event loop, which goes on serving the
        process's other calls while this one waits (unless this thread reads the frames)."""
        if self.reads_itself:
            return self._credit_for(call_id, chunk)
        credits = self.credits
        cancellations = self.cancellations
        while chunk and not credits.spend(call_id, len(chunk)):
            if cancellations.is_cancelled(call_id) or credits.closed:
                return False
            await credits.wait_async(call_id, lambda: cancellations.is_cancelled(call_id))
        return True

    def _pass_on(self, call_id: int, chunk: bytes) -> bool:
        """Write one chunk of a streamed answer; ``False`` once the front cancelled the call
        (nobody reads on: the generator is to stop producing)."""
        if self.cancellations.is_cancelled(call_id):
            return False
        if len(chunk) > INLINE_LIMIT:  # as a memfd: never whole in the front's memory
            fd = memfd([chunk])
            try:
                self.channel.write(Chunk(call_id, None), fd)
            finally:
                os.close(fd)
        elif chunk:
            self.channel.write(Chunk(call_id, bytes(chunk)))
        return True

    async def _send_async(self, call_id: int, reply: EncodedResponse) -> None:
        """A streamed answer whose chunks come from an async iterator (an ``async def``
        generator), written as they come. Its task cancelled (the front's :class:`Cancel`),
        the iterator is closed and the stream ended."""
        body = reply.body
        assert isinstance(body, AsyncIterator)
        self.credits.open(call_id)
        self.channel.write(Answer(call_id, reply.status, reply.headers, None, True))
        failed = False
        try:
            async for chunk in body:
                if not await self._credit_for_async(call_id, chunk) or not self._pass_on(
                    call_id, chunk
                ):
                    break
        except Exception as exc:
            failed = _stream_failed(exc)
        except BaseException:  # its task cancelled (not imported: asyncio only when needed)
            failed = True
            raise
        finally:
            self.credits.finished(call_id)
            aclose = getattr(body, "aclose", None)
            if callable(aclose):
                await aclose()
            self.channel.write(End(call_id, failed))


#: The answer of an interrupted call, which the front drops (it answered the call already).
_CANCELLED: Final = EncodedResponse(499, (), b"")


def _batch_request_id(requests: list[Request]) -> str:
    """What a batch's log records name as their request: its requests' ids."""
    return ",".join(request.request_id for request in requests)


def _stream_failed(exc: Exception) -> bool:
    """Headers are out: the front can only cut the chunked body short. Logged; ``True``."""
    _log.error("the handler's streamed content failed after the response began: %s", exc)
    return True


class _RequestIds:
    """The call's ids for the handler's log records while it runs, and its handler span,
    current meanwhile, when it is traced (a class: a generator context manager costs a
    microsecond more per call)."""

    __slots__ = ("_request_id", "_requester_id", "_span", "_tokens")

    def __init__(
        self, request_id: str, requester_id: str | None, span: HandlerSpan | None = None
    ) -> None:
        self._request_id = request_id
        self._requester_id = requester_id
        self._span = span

    def __enter__(self) -> HandlerSpan | None:
        self._tokens = (
            request_id_var.set(self._request_id),
            requester_id_var.set(self._requester_id),
        )
        if self._span is not None:
            self._span.__enter__()
        return self._span

    def __exit__(self, *exc_info: object) -> None:
        if self._span is not None:
            self._span.__exit__()
        request_id_var.reset(self._tokens[0])
        requester_id_var.reset(self._tokens[1])
