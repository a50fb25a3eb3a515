"""The life of one request, from the first check to the last byte, in the order it happens.

:meth:`Lifecycle.serve` reads top to bottom:

1. **available**: while no handler is loaded (or it is gone), ``503 service unavailable``;
2. **decoded**: method, size limits and body become the handler's ``Request`` (``405``,
   ``413``, ``400`` on the way); multipart parts are spooled to disk as they arrive;
3. **admitted**: at most ``concurrency`` calls run and ``max_queue`` more wait; the rest get
   ``503 service busy``;
4. **called within the deadline** (``504`` when it passes): a ``def`` handler on a handler
   thread together with the encoding of its result, an ``async def`` handler on the loop with
   its result encoded on a handler thread;
5. **sent**: counted (metrics, access log) before its first byte, then written; only then may
   the handler thread take its next call.

An async request of ABEJA Platform (``x-abeja-arms-async-request-id``) leaves the line after
step 2: it is answered ``202`` at once, and steps 3 and 4 run in a task of their own whose
answer goes to the platform API instead (``arms.py``). A gRPC call (``rpc.py``) takes steps 1,
3 and 4 through :meth:`Lifecycle.run_call`; the gRPC server decodes and sends it, and counts it
with :meth:`Lifecycle.account`. Batch mode (``batch.py``) builds its requests itself and takes
steps 1, 3 and 4 through :meth:`Lifecycle.answer`.

Every error on the way becomes a reply through :meth:`Lifecycle._error_reply`, the one error →
response ladder. Everything the lifecycle counts (in flight, admitted, draining, connections to
shed) is in :class:`ServingState`. HTTP itself (aiohttp, sockets, ``100 Continue``, closing a
connection) stays behind the :class:`Exchange` that ``server.py`` implements, and running calls
on threads behind the :class:`~abeja_runtime.execute.Executor`.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, TypeVar

from abeja_runtime import __version__
from abeja_runtime.arms import (
    ASYNC_ID_HEADER,
    ASYNC_TOKEN_HEADER,
    MAX_PENDING,
    ResultSender,
    async_id_problem,
)
from abeja_runtime.config import Config
from abeja_runtime.decode import BodyLimits, decode_request
from abeja_runtime.encode import EncodedResponse, encode_result, status_reply
from abeja_runtime.errors import (
    HandlerResultError,
    HandlerTimeout,
    HttpError,
    ImageTooLarge,
    ServiceBusy,
    ServiceUnavailable,
)
from abeja_runtime.execute import Call, Executor, Outcome, claim
from abeja_runtime.handler import LoadedHandler
from abeja_runtime.logs import AccessLog, request_id_var, requester_id_var, user_exc_info
from abeja_runtime.metrics import WorkerMetrics
from abeja_runtime.pixels import is_image_bomb
from abeja_runtime.request import Request

if sys.version_info >= (3, 11):
    from asyncio import timeout as _timeout
else:  # pragma: no cover - Python 3.10
    from async_timeout import timeout as _timeout

__all__ = ["REQUEST_ID_HEADER", "Exchange", "Lifecycle", "ServingState"]

_log = logging.getLogger("abeja_runtime")
_T = TypeVar("_T")

RUNTIME_VERSION_HEADER: Final = "x-abeja-sys-meta-runtime-version"
REQUEST_ID_HEADER: Final = "x-abeja-request-id"
REQUESTER_ID_HEADER: Final = "x-abeja-requester-id"


class Exchange(Protocol):
    """One HTTP request and its answer, as the server library presents them."""

    method: str
    path: str  # decoded, for the access log
    raw_path: str
    raw_query: str
    content_length: int | None
    keep_alive: bool

    def header(self, name: str) -> str | None: ...

    def headers(self) -> Iterable[tuple[str, str]]: ...

    def body(self) -> AsyncIterator[bytes]:
        """The body's chunks; asks the client for it first (``100 Continue``) if it waits."""
        ...

    async def send(self, reply: EncodedResponse, *, close: bool) -> None:
        """Write the whole reply (streamed bodies chunk by chunk); a client gone is no error."""

    async def refuse(self, reply: EncodedResponse) -> None:
        """Answer at once, read a bounded rest of the body that is refused, then close."""


@dataclass
class ServingState:
    """Everything about a worker that requests change or read, in one place.

    ``in_flight`` counts HTTP requests being answered (a graceful drain waits for it to reach
    0); ``admitted`` counts handler calls running or waiting for a thread (admission bounds it
    by ``concurrency + max_queue``; a call that outlived its deadline still counts until its
    thread returns).
    """

    concurrency: int
    max_queue: int
    handler: LoadedHandler | None = None
    draining: bool = False
    in_flight: int = 0
    #: Requests answered so far, and when to call ``on_request_limit`` (--max-requests).
    answered: int = 0
    request_limit: int | None = None
    on_request_limit: Callable[[], None] | None = None
    admitted: int = 0
    #: Connections to close after their next response, as the supervisor asked (rebalancing).
    shed: int = 0
    idle_waiters: list[asyncio.Future[None]] = field(default_factory=list)

    @property
    def ready(self) -> bool:
        return self.handler is not None and not self.draining

    @property
    def queued(self) -> int:
        """Admitted calls waiting for a handler thread."""
        return max(0, self.admitted - self.concurrency)

    def serving_handler(self) -> LoadedHandler:
        """The handler to call. While draining, a request that arrives on a connection the
        worker already has is still served (a load balancer may have sent it before it saw
        readiness go 503); only new connections are no longer accepted."""
        if self.handler is None:
            raise ServiceUnavailable()
        return self.handler

    def admit(self) -> None:
        if self.admitted >= self.concurrency + self.max_queue:
            raise ServiceBusy()
        self.admitted += 1

    def call_done(self) -> None:
        self.admitted -= 1

    def close_after_response(self, keep_alive: bool) -> bool:
        """Whether this response ends its connection: while draining, or to shed it (which
        uses up one of the connections the supervisor asked to shed)."""
        if self.draining:
            return True
        if self.shed and keep_alive:
            self.shed -= 1
            return True
        return False

    def request_done(self) -> None:
        self.in_flight -= 1
        if not self.in_flight:
            for waiter in self.idle_waiters:
                if not waiter.done():
                    waiter.set_result(None)
            self.idle_waiters.clear()


class Lifecycle:
    """Serves each request of one worker; see the module docstring for the steps."""

    def __init__(
        self, config: Config, executor: Executor, state: ServingState, metrics: WorkerMetrics
    ) -> None:
        self._config = config
        self._executor = executor
        self._state = state
        self._metrics = metrics
        self._limits = BodyLimits(
            max_body_size=config.max_body_size,
            spool_threshold=config.spool_threshold,
            max_parts=config.max_parts,
        )
        self._timeout = config.timeout
        self._async_slots = asyncio.Semaphore(config.concurrency)
        extra_headers = ((RUNTIME_VERSION_HEADER, __version__), *config.platform.response_headers())
        self._encode = functools.partial(encode_result, extra_headers=extra_headers)
        self._access_log = AccessLog(config.platform.log_fields())
        missing = ResultSender.missing(config.platform)
        self._async_refusal = (
            status_reply(
                501,
                f"async requests need {', '.join(missing)} to send their results to; set them, "
                f"or send the request without {ASYNC_ID_HEADER}",
            )
            if missing
            else None
        )
        self._results = ResultSender(config.platform)
        #: Async requests answered 202 whose result is not sent yet (they count in
        #: ``in_flight``); the set also keeps their tasks referenced.
        self._async_jobs: set[asyncio.Task[None]] = set()

    @property
    def ready(self) -> bool:
        """What this worker's own ``/health_check`` says."""
        return self._state.ready

    async def serve(self, exchange: Exchange) -> None:
        received = time.time()
        request_id = exchange.header(REQUEST_ID_HEADER) or os.urandom(16).hex()
        request_token = request_id_var.set(request_id)
        requester_token = requester_id_var.set(exchange.header(REQUESTER_ID_HEADER))
        self._state.in_flight += 1
        try:
            await self._serve(exchange, request_id, received)
        finally:
            self._state.request_done()
            request_id_var.reset(request_token)
            requester_id_var.reset(requester_token)

    async def _serve(self, exchange: Exchange, request_id: str, received: float) -> None:
        tag = (REQUEST_ID_HEADER, request_id)
        try:
            handler = self._state.serving_handler()
            request = await decode_request(
                method=exchange.method,
                raw_path=exchange.raw_path,
                raw_query=exchange.raw_query,
                headers=exchange.headers(),
                content_length=exchange.content_length,
                body=exchange.body(),
                limits=self._limits,
                request_id=request_id,
            )
        except HttpError as exc:
            reply = self._error_reply(exc).with_headers((tag,))
            if exc.ends_connection:  # the body was not read whole
                self._account(exchange, reply.status, received)
                await exchange.refuse(reply)
            else:
                await self._send(exchange, reply, received)
            return
        async_id = exchange.header(ASYNC_ID_HEADER)
        if async_id:
            await self._accept_async(exchange, handler, request, async_id, tag, received)
            return
        try:
            try:
                outcome = await self._call(handler, request)
            except Exception as exc:
                reply = self._error_reply(exc, handler)
                await self._send(exchange, reply.with_headers((tag,)), received)
                return
            try:
                reply = outcome.value
                if outcome.chunks is not None:
                    reply = EncodedResponse(reply.status, reply.headers, outcome.chunks)
                await self._send(exchange, reply.with_headers((tag,)), received)
            finally:
                outcome.release()  # the handler thread may take its next call
        finally:
            request.close()

    async def _accept_async(
        self,
        exchange: Exchange,
        handler: LoadedHandler,
        request: Request,
        async_id: str,
        tag: tuple[str, str],
        received: float,
    ) -> None:
        """Answer 202 now; the call runs in a task, and its answer goes to the platform."""
        problem = async_id_problem(async_id)
        refusal = status_reply(400, problem) if problem else self._async_refusal
        if refusal is None and len(self._async_jobs) >= MAX_PENDING:
            refusal = self._error_reply(ServiceBusy())
        if refusal is not None:
            request.close()
            await self._send(exchange, refusal.with_headers((tag,)), received)
            return
        self._state.in_flight += 1  # until the result is sent: a graceful shutdown waits for it
        token = exchange.header(ASYNC_TOKEN_HEADER) or ""
        job = asyncio.create_task(self._run_async(handler, request, async_id, token, tag))
        self._async_jobs.add(job)
        job.add_done_callback(self._async_jobs.discard)
        accepted = EncodedResponse(202, (("Content-Type", "application/json"), tag), b"")
        await self._send(exchange, accepted, received, close=True)

    async def _run_async(
        self,
        handler: LoadedHandler,
        request: Request,
        async_id: str,
        token: str,
        tag: tuple[str, str],
    ) -> None:
        try:
            try:
                reply = await self._collected_call(handler, request)
            except HttpError as exc:  # a timeout or a full queue: the answer a client would get
                reply = self._error_reply(exc)
            except Exception as exc:
                self._error_reply(exc, handler)  # logged as for any request
                await self._results.send_failure(async_id, token, "response from runtime")
                return
            await self._results.send_result(async_id, token, reply.with_headers((tag,)))
        finally:
            request.close()
            self._state.request_done()

    async def run_call(self, work: Callable[[], Any], *, is_async: bool) -> Any:
        """A call that answers no HTTP request (a gRPC one, ``rpc.py``): available, admitted
        and called within the deadline like a request's call; ``work()`` runs on the handler
        thread, or is awaited on the loop when ``is_async``. The caller answers, and counts
        the answer with :meth:`account`."""
        self._state.in_flight += 1  # a graceful drain waits for it
        try:
            self._state.serving_handler()
            if is_async:
                return await self._admitted(functools.partial(self._await_in_slot, work))
            thread_call = functools.partial(_no_chunks, work)
            outcome = await self._admitted(functools.partial(self._on_thread, thread_call))
            outcome.release()  # nothing to write here: the caller sends the value
            return outcome.value
        except HttpError as exc:
            self._count_refusal(exc)
            raise
        finally:
            self._state.request_done()

    async def answer(self, request: Request, name: str) -> EncodedResponse:
        """A request built in this process (batch mode, ``batch.py``): available, admitted and
        called within the deadline like any other, every error a reply through the one ladder,
        counted under ``name``. The reply's body is in memory; the request is closed."""
        received = time.time()
        token = request_id_var.set(request.request_id)
        self._state.in_flight += 1
        handler = None
        try:
            try:
                handler = self._state.serving_handler()
                reply = await self._collected_call(handler, request)
            except Exception as exc:
                reply = self._error_reply(exc, handler)
            self.account("POST", name, reply.status, received)
            return reply
        finally:
            request.close()
            self._state.request_done()
            request_id_var.reset(token)

    async def _collected_call(self, handler: LoadedHandler, request: Request) -> EncodedResponse:
        """The call's reply with its whole body in memory (answered to no client directly)."""
        outcome = await self._call(handler, request)
        try:
            return await _collected(outcome)
        finally:
            outcome.release()

    async def _call(self, handler: LoadedHandler, request: Request) -> Outcome:
        """Admission and the deadline around one handler call."""
        context = copy.deepcopy(self._config.context) if self._config.context else {}
        if handler.is_async:
            start = functools.partial(self._call_async, handler, request, context)
            return await self._admitted(start)
        call = functools.partial(_call_and_encode, handler.func, request, context, self._encode)
        return await self._admitted(functools.partial(self._on_thread, call))

    async def _admitted(self, start: Callable[[], Awaitable[_T]]) -> _T:
        """Admission (``503 service busy`` beyond the queue) and the deadline around a call."""
        self._state.admit()
        deadline = _timeout(self._timeout or None)
        try:
            async with deadline:
                return await start()
        except asyncio.TimeoutError:  # not the builtin one before Python 3.11
            if _expired(deadline):
                raise HandlerTimeout(self._timeout) from None
            raise

    async def _on_thread(self, call: Call) -> Outcome:
        return await claim(self._executor.submit(call, self._state.call_done))

    async def _await_in_slot(self, work: Callable[[], Awaitable[Any]]) -> Any:
        try:
            async with self._async_slots:
                return await work()
        finally:
            self._state.call_done()

    async def _call_async(self, handler: LoadedHandler, request: Request, context: Any) -> Outcome:
        """Awaited on the loop, at most ``concurrency`` at once; the slot is held until the
        result is encoded (and streamed) on a handler thread."""
        slots = self._async_slots
        handed_over = False
        try:
            await slots.acquire()
            try:
                result = await handler.func(request, context)
                encode = functools.partial(_encode, self._encode, result)
                future = self._executor.submit(encode, self._async_call_done)
                handed_over = True
            finally:
                if not handed_over:
                    slots.release()
            return await claim(future)
        finally:
            if not handed_over:
                self._state.call_done()

    def _async_call_done(self) -> None:
        self._state.call_done()
        self._async_slots.release()

    def _error_reply(self, exc: Exception, handler: LoadedHandler | None = None) -> EncodedResponse:
        """The one error → response ladder: what the client is told, and what is logged."""
        if is_image_bomb(exc):
            exc = ImageTooLarge(self._config.max_image_pixels)
        if isinstance(exc, HttpError):
            self._count_refusal(exc)
            return status_reply(exc.status, exc.message, exc.headers.items())
        if isinstance(exc, HandlerResultError):
            _log.error("the handler's return value breaks the contract: %s", exc)
        else:
            _log.error(
                "unexpected error occurred in the handler %s",
                handler.name if handler is not None else "",
                exc_info=user_exc_info(exc),
            )
        return status_reply(500, "unexpected error occurred")

    def _count_refusal(self, exc: HttpError) -> None:
        if isinstance(exc, ServiceBusy):
            self._metrics.rejected("busy")
        elif isinstance(exc, ServiceUnavailable):
            self._metrics.rejected("unavailable")

    async def _send(
        self, exchange: Exchange, reply: EncodedResponse, received: float, *, close: bool = False
    ) -> None:
        close = close or self._state.close_after_response(exchange.keep_alive)
        self._account(exchange, reply.status, received)
        await exchange.send(reply, close=close)

    def _account(self, exchange: Exchange, status: int, received: float) -> None:
        self.account(exchange.method, exchange.path, status, received)

    def account(self, method: str, path: str, status: int, received: float) -> None:
        """Counted before the first byte leaves, so that a client never holds an answer that a
        scrape (or a crash of this worker right after it) does not count."""
        responded = time.time()
        state = self._state
        state.answered += 1
        if state.answered == state.request_limit and state.on_request_limit is not None:
            state.on_request_limit()
        self._access_log.record(method, path, status, received, responded)
        self._metrics.observe(status, responded - received)


async def _collected(outcome: Outcome) -> EncodedResponse:
    """The outcome's reply with its whole body in memory (a streamed one is gathered)."""
    reply: EncodedResponse = outcome.value
    if outcome.chunks is None:
        return reply
    body = b"".join([chunk async for chunk in outcome.chunks])
    return EncodedResponse(reply.status, reply.headers, body)


_Split = tuple[EncodedResponse, Iterator[bytes] | None]


def _split(reply: EncodedResponse) -> _Split:
    """The reply, and the chunks its thread must produce when its body is streamed."""
    body = reply.body
    return (reply, body) if isinstance(body, Iterator) else (reply, None)


def _no_chunks(work: Callable[[], Any]) -> tuple[Any, None]:
    return work(), None


def _call_and_encode(
    func: Callable[..., Any], request: Request, context: Any, encode: Callable[[Any], Any]
) -> _Split:
    """Runs on the handler thread: the call and the (possibly CPU-heavy) encoding together."""
    return _split(encode(func(request, context)))


def _encode(encode: Callable[[Any], EncodedResponse], result: Any) -> _Split:
    return _split(encode(result))


def _expired(deadline: Any) -> bool:
    expired = deadline.expired
    return bool(expired() if callable(expired) else expired)
