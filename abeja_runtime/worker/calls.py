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
from collections.abc import Iterable
from typing import IO, Any, Final

from abeja_runtime import __version__
from abeja_runtime.config import Config
from abeja_runtime.encode import UNEXPECTED_ERROR, EncodedResponse, encode_result, status_reply
from abeja_runtime.errors import HandlerResultError, HttpError, ImageTooLarge
from abeja_runtime.limits import BodyLimits
from abeja_runtime.logs import user_exc_info
from abeja_runtime.pixels import is_image_bomb
from abeja_runtime.styles import LoadedHandler
from abeja_runtime.worker.decode import decode_request
from abeja_runtime.worker.request import Request

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
        self._encode = functools.partial(encode_result, extra_headers=extra_headers)

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
        iterated, on the caller's thread); the request stays open for the stream."""
        try:
            return self._encode(self.handler.func(request, self.context()))
        except Exception as exc:
            return self.error_reply(exc)

    async def answer_async(self, request: Request) -> EncodedResponse:
        """The same for an ``async def`` handler."""
        try:
            return self._encode(await self.handler.func(request, self.context()))
        except Exception as exc:
            return self.error_reply(exc)

    def error_reply(self, exc: Exception) -> EncodedResponse:
        """The handler side's error → response ladder: what the client is told, and what is
        logged."""
        if is_image_bomb(exc):
            exc = ImageTooLarge(self._max_image_pixels)
        if isinstance(exc, HttpError):
            return status_reply(exc.status, exc.message, exc.headers.items())
        if isinstance(exc, HandlerResultError):
            _log.error(
                "the return value of the handler %s breaks the contract: %s",
                self.handler.name,
                exc,
            )
        else:
            _log.error(
                "unexpected error occurred in the handler %s",
                self.handler.name,
                exc_info=user_exc_info(exc),
            )
        return UNEXPECTED_ERROR
