"""One handler call, on the handler's side: request in, encoded answer out, every error an answer.

A handler process (``worker/process.py``) and a batch run (``batch.py``) both go through here: the
request is built (``decode.py``: the file-like body, multipart parts spooled to disk), the
handler is called with a fresh copy of the context, and its result is checked and encoded
(``encode.py``). What goes wrong on the way becomes a reply through
:meth:`HandlerCalls.error_reply`, the one error → response ladder of the handler side (the front
has its own refusals: busy, timeout, unavailable). Nothing here knows sockets, processes or HTTP
servers.
"""

from __future__ import annotations

import copy
import functools
import logging
from collections.abc import Callable, Iterable
from typing import IO, Any, Final

from abeja_runtime import __version__
from abeja_runtime.batched import declared_batch
from abeja_runtime.config import Config
from abeja_runtime.encode import UNEXPECTED_ERROR, EncodedResponse, encode_result, status_reply
from abeja_runtime.errors import HandlerResultError, HttpError, ImageTooLarge
from abeja_runtime.limits import BodyLimits
from abeja_runtime.logs import user_exc_info
from abeja_runtime.pixels import is_image_bomb
from abeja_runtime.styles import LoadedHandler
from abeja_runtime.tracing import Tracing
from abeja_runtime.worker.decode import decode_request
from abeja_runtime.worker.request import Request, was_iterated

__all__ = [
    "RUNTIME_VERSION_HEADER",
    "HandlerCalls",
]

_log = logging.getLogger("abeja_runtime")

RUNTIME_VERSION_HEADER: Final = "x-abeja-sys-meta-runtime-version"


class HandlerCalls:
    """The calls of one loaded handler."""

    def __init__(self, config: Config, handler: LoadedHandler) -> None:
        self.handler = handler
        self._config = config
        self._max_image_pixels = config.max_image_pixels
        self._limits = BodyLimits(
            max_body_size=0,  # the front counted the body already
            spool_threshold=config.spool_threshold,
            max_parts=config.max_parts,
        )
        extra_headers = ((RUNTIME_VERSION_HEADER, __version__), *config.platform.response_headers())
        self._encode: Callable[[Any], EncodedResponse] = functools.partial(
            encode_result, extra_headers=extra_headers
        )
        #: The handler takes a list of requests and returns a list (``--max-batch-size``, or
        #: ``@abeja_runtime.batched``).
        self.batched = config.max_batch_size > 1 or declared_batch(handler.func) is not None

    def trace_encoding(self, tracing: Tracing) -> None:
        """Each answer encoded in a span of its own (:mod:`abeja_runtime.tracing`)."""
        self._encode = tracing.encoding(self._encode)

    def request(
        self,
        *,
        method: str,
        raw_path: str,
        raw_query: str,
        headers: Iterable[tuple[str, str]],
        body: IO[bytes],
        request_id: str,
    ) -> Request:
        """The handler's request; ``HttpError`` (400, 413) for a body it cannot be built from."""
        return decode_request(
            method=method,
            raw_path=raw_path,
            raw_query=raw_query,
            headers=headers,
            body=body,
            limits=self._limits,
            request_id=request_id,
        )

    def context(self) -> Any:
        """A fresh copy per call: one call's changes never reach the next."""
        return copy.deepcopy(self._config.context) if self._config.context else {}

    def answer(self, request: Request) -> EncodedResponse:
        """Call a ``def`` handler and encode its result (a streamed body is still to be
        iterated, on the caller's thread); the request stays open for the stream. A batched
        handler (``--max-batch-size``) gets a batch of one (a batch run's requests)."""
        if self.batched:
            return self.answer_batch([request])[0]
        try:
            return self._encode(self.handler.func(request, self.context()))
        except Exception as exc:
            return self.error_reply(exc, note=self._batching_note(request))

    async def answer_async(self, request: Request) -> EncodedResponse:
        """The same for an ``async def`` handler."""
        if self.batched:
            return (await self.answer_batch_async([request]))[0]
        try:
            return self._encode(await self.handler.func(request, self.context()))
        except Exception as exc:
            return self.error_reply(exc, note=self._batching_note(request))

    def _batching_note(self, request: Request) -> str:
        """For the log of a failed call of an ABEJA-style handler served one request a call
        that went over its request's keys, as a handler written for batches goes over its list
        (``for r in requests``: each ``r`` a key, and ``json.load(r)`` fails with ``'str'
        object has no attribute 'read'``): how it is served, and how to serve it batches."""
        if self.handler.style != "abeja" or not was_iterated(request):
            return ""
        return (
            "; the handler went over the keys of its request, as a handler written for batches "
            "goes over its list of requests, but it is served one request a call, not batched "
            "(--max-batch-size is 1 and it is not declared @abeja_runtime.batched): if it "
            "takes a list of requests, serve it with --max-batch-size N above 1 "
            "(ABEJA_RUNTIME_MAX_BATCH_SIZE) or declare it with @abeja_runtime.batched()"
        )

    def answer_batch(self, requests: list[Request]) -> list[EncodedResponse]:
        """Call a batched ``def`` handler once for ``requests`` (``handler(requests,
        context)``) and encode each of its results: one reply per request, in order."""
        try:
            results = self.handler.func(requests, self.context())
        except Exception as exc:
            return [self.error_reply(exc)] * len(requests)
        return self._batch_replies(results, len(requests))

    async def answer_batch_async(self, requests: list[Request]) -> list[EncodedResponse]:
        """The same for an ``async def`` batched handler."""
        try:
            results = await self.handler.func(requests, self.context())
        except Exception as exc:
            return [self.error_reply(exc)] * len(requests)
        return self._batch_replies(results, len(requests))

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
            return status_reply(exc.status, exc.message, exc.headers.items())
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
