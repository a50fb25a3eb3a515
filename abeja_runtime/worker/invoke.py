"""Invoking the handler: requests in, encoded replies out, every error a reply.

A handler process (``runner.py``), its warm-up and a batch job call the handler through
:class:`Invoker`, whose :meth:`~Invoker.error_reply` is the handler side's one error → response
ladder. :func:`settled` is the one place where ``def`` and ``async def`` meet: the code that runs
a call is written once, as coroutines, and awaits through it what the handler (a stream, a wait)
gives; where no event loop runs, :func:`finish` runs those coroutines, which never wait there.
"""

from __future__ import annotations

import copy
import functools
import inspect
import logging
import sys
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Coroutine, Iterable
from typing import Any, Final, TypeVar, cast

from abeja_runtime import __version__
from abeja_runtime.batched import declared_batch
from abeja_runtime.config import Config
from abeja_runtime.encode import (
    UNEXPECTED_ERROR,
    EncodedResponse,
    encode_result,
    error_reply,
)
from abeja_runtime.errors import HandlerResultError, HttpError, ImageTooLarge
from abeja_runtime.limits import BodyLimits
from abeja_runtime.logs import user_exc_info
from abeja_runtime.pixels import is_image_bomb
from abeja_runtime.styles import LoadedHandler
from abeja_runtime.tracing import Tracing
from abeja_runtime.worker.request import Request, was_iterated

__all__ = [
    "RUNTIME_VERSION_HEADER", "Invoker", "chunks", "close_stream", "finish", "loop_steps",
    "settled",
]  # fmt: skip

_log = logging.getLogger("abeja_runtime")
_T = TypeVar("_T")

RUNTIME_VERSION_HEADER: Final = "x-abeja-sys-meta-runtime-version"


async def settled(value: _T | Awaitable[_T]) -> _T:
    """``value`` as it is, or awaited when it is awaitable (what an ``async def`` gave): on the
    running event loop, or on this thread's own loop when none runs here."""
    if type(value) in _PLAIN or not inspect.isawaitable(value):
        return value  # type: ignore[return-value]  # not awaitable: a _T
    if _on_event_loop():
        return cast(_T, await value)
    # This thread's own loop, made on first use (asyncio imported then only): what a ``def``
    # handler gives to await (an async generator's chunks) runs on it, between calls.
    loop = getattr(_threads, "loop", None)
    if loop is None:
        import asyncio

        loop = _threads.loop = asyncio.new_event_loop()
    return cast(_T, loop.run_until_complete(value))


#: What a handler, a stream or a wait most often gives, never awaitable (a type test is cheaper).
_PLAIN: Final = frozenset({dict, bytes, tuple, EncodedResponse, type(None)})
_threads = threading.local()


def _on_event_loop() -> bool:
    """Whether an event loop runs on this thread (asyncio is not imported to tell)."""
    imported = sys.modules.get("asyncio")
    return imported is not None and imported._get_running_loop() is not None


def finish(coroutine: Coroutine[Any, Any, _T]) -> _T:
    """Run ``coroutine`` to its end on this thread, where no event loop runs (what it awaits
    through :func:`settled` is done at once)."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return cast(_T, done.value)
    coroutine.close()
    raise RuntimeError("a coroutine waited for an event loop on a thread that runs none")


def loop_steps(body: object) -> bool:
    """Whether ``body`` is an async generator that the loop running here steps itself (each item
    awaited as it comes, with ``async for``: no step through :func:`settled`)."""
    return inspect.isasyncgen(body) and _on_event_loop()


def chunks(body: Iterable[_T] | AsyncIterator[_T]) -> AsyncGenerator[_T, None]:
    """A handler's generator, sync or async, as an async generator of what it yields, which
    closes it (its ``finally`` runs) when closed, also before its end: one the loop steps
    (:func:`loop_steps`) as it is, any other stepped through :func:`settled`."""
    if loop_steps(body):
        return cast("AsyncGenerator[_T, None]", body)
    return _stepped(body)


async def _stepped(body: Iterable[_T] | AsyncIterator[_T]) -> AsyncGenerator[_T, None]:
    try:
        step = body.__anext__ if isinstance(body, AsyncIterator) else iter(body).__next__
        while True:
            try:
                chunk = await settled(step())
            except (StopIteration, StopAsyncIteration):
                return
            yield chunk
    finally:
        close = getattr(body, "aclose", None) or getattr(body, "close", None)
        if callable(close):
            await settled(close())


async def close_stream(body: AsyncGenerator[Any, None]) -> None:
    """Close a streamed answer's generator (its ``finally`` runs), however the stream ended: a
    failure of the handler's own ``finally`` is logged, not raised, for the stream's ``End``
    must still go to the front."""
    try:
        await body.aclose()
    except Exception as exc:
        _log.error("closing the handler's streamed content failed: %s", exc)


class Invoker:
    """The calls of one loaded handler."""

    def __init__(
        self, config: Config, handler: LoadedHandler, tracing: Tracing | None = None
    ) -> None:
        self.handler = handler
        self._context = config.context
        self._max_image_pixels = config.max_image_pixels
        self.limits = BodyLimits(
            max_body_size=0,  # the front counted the body already
            spool_threshold=config.spool_threshold,
            max_parts=config.max_parts,
        )
        extra_headers = ((RUNTIME_VERSION_HEADER, __version__), *config.platform.response_headers())
        self._encode: Callable[[Any], EncodedResponse] = functools.partial(
            encode_result, extra_headers=extra_headers
        )
        if tracing is not None:  # each answer encoded in a span of its own
            self._encode = tracing.encoding(self._encode)
        #: The handler takes a list of requests and returns a list (``--max-batch-size``, or
        #: ``@abeja_runtime.batched``).
        self.batched = config.max_batch_size > 1 or declared_batch(handler.func) is not None

    async def answer(self, requests: list[Request]) -> list[EncodedResponse]:
        """The handler's replies to ``requests``, one each, in order: a batched handler called
        once with the list, any other with the one request. A streamed body is still to be
        iterated; the requests stay open for it."""
        func = self.handler.func
        # A fresh copy of the context per call: one call's changes never reach the next.
        context = copy.deepcopy(self._context) if self._context else {}
        try:
            if self.batched:
                results = await settled(func(requests, context))
                return self._batch_replies(results, len(requests))
            return [self._encode(await settled(func(requests[0], context)))]
        except Exception as exc:
            return [self.error_reply(exc, note=self._batching_note(requests))] * len(requests)

    def _batching_note(self, requests: list[Request]) -> str:
        """For the log of a failed call of an unbatched ABEJA-style handler that went over its
        request's keys (``for r in requests``, ``json.load(r)``: ``'str' object has no
        attribute 'read'``): how to serve it batches."""
        if self.batched or self.handler.style != "abeja" or not was_iterated(requests[0]):
            return ""
        return (
            "; the handler went over the keys of its request, as a handler written for batches "
            "goes over its list of requests, but it is served one request a call, not batched "
            "(--max-batch-size is 1 and it is not declared @abeja_runtime.batched): if it "
            "takes a list of requests, serve it with --max-batch-size N above 1 "
            "(ABEJA_RUNTIME_MAX_BATCH_SIZE) or declare it with @abeja_runtime.batched()"
        )

    def _batch_replies(self, results: object, count: int) -> list[EncodedResponse]:
        """Each result encoded, an exception instance as its own ``500`` (its neighbours are
        answered); anything but a list of ``count`` results fails the whole batch."""
        if not isinstance(results, list | tuple) or len(results) != count:
            given = (
                f"{len(results)} results" if isinstance(results, list | tuple)
                else f"a {type(results).__name__}"
            )  # fmt: skip
            _log.error(
                "the batched handler %s returned %s for a batch of %d requests; it must return "
                "a list of one response per request, in the requests' order",
                self.handler.name,
                given,
                count,
            )
            return [UNEXPECTED_ERROR] * count
        replies = []
        for result in results:
            if isinstance(result, Exception):
                replies.append(self.error_reply(result))
                continue
            try:
                replies.append(self._encode(result))
            except Exception as exc:
                replies.append(self.error_reply(exc))
        return replies

    def error_reply(self, exc: Exception, *, note: str = "") -> EncodedResponse:
        """The handler side's error → response ladder: what the client is told, and what is
        logged (``note`` appended to the logged message)."""
        if is_image_bomb(exc):
            exc = ImageTooLarge(self._max_image_pixels)
        if isinstance(exc, HttpError):
            return error_reply(exc)
        if isinstance(exc, HandlerResultError):
            _log.error(
                "the return value of the handler %s breaks the contract: %s%s",
                self.handler.name,
                exc,
                note,
            )
        else:
            _log.error(
                "unexpected error occurred in the handler %s%s",
                self.handler.name,
                note,
                exc_info=user_exc_info(exc),
            )
        return UNEXPECTED_ERROR
