"""The exceptions of abeja-runtime.

Lower layers (loading, decoding, encoding, execution) raise these; the answers they become are
made in one place on each side (``front/server.py`` for the front's refusals, ``worker/invoke.py``
for a call's errors), and only the command line turns them into exit codes.
"""

from __future__ import annotations

import math

__all__ = [
    "AbejaRuntimeError",
    "BadRequest",
    "BodyCannotArriveInTime",
    "BodyTimeout",
    "BodyTooSlow",
    "CallCancelled",
    "HandlerLoadError",
    "HandlerResultError",
    "HandlerTimeout",
    "HeadTooLarge",
    "HttpError",
    "ImageTooLarge",
    "InsufficientStorage",
    "MethodNotAllowed",
    "PayloadTooLarge",
    "ServiceBusy",
    "ServiceUnavailable",
    "TooManyParts",
    "Unauthorized",
    "WorkerCrashed",
    "deadline_passed",
    "handler_format_message",
]


class AbejaRuntimeError(Exception):
    """Base class of every error this package raises on purpose."""


class CallCancelled(BaseException):
    """Raised in a ``def`` handler when nobody waits for its answer any more (its client left,
    its deadline passed), with ``--cancel-raises``. A ``BaseException``, as
    ``asyncio.CancelledError`` and ``KeyboardInterrupt`` are, so that a handler's ``except
    Exception`` does not swallow it; its ``finally`` clauses run."""


class HandlerLoadError(AbejaRuntimeError):
    """The user's handler could not be found, imported or used; the message says how to fix it."""


def handler_format_message(spec: str) -> str:
    """ABEJA's words for a HANDLER that is not ``module:function`` (contract A4; typo fixed)."""
    return (
        f"Possibly, your HANDLER[{spec}] parameter is wrong. handler needs one ':' separator. "
        "The format is <module>:<function>, e.g. main:handler."
    )


class HandlerResultError(AbejaRuntimeError):
    """The handler returned something that breaks the response contract (contract A3).

    The client only sees ``500 unexpected error occurred``; this message goes to the log so that
    the handler's author learns exactly what was wrong.
    """


class HttpError(AbejaRuntimeError):
    """An error with a status code and a message meant for the client."""

    status: int = 500
    #: The body was not read whole: the answer goes out, then the connection is closed.
    ends_connection: bool = False

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}


class BadRequest(HttpError):
    status = 400


class MethodNotAllowed(HttpError):
    status = 405

    def __init__(self, method: str, allowed: tuple[str, ...]) -> None:
        super().__init__(
            f"method {method} is not allowed; use one of {', '.join(allowed)}",
            headers={"Allow": ", ".join(allowed)},
        )


class PayloadTooLarge(HttpError):
    status = 413
    ends_connection = True

    def __init__(self, limit: int) -> None:
        super().__init__(f"request body too large (limit {limit} bytes)")
        self.limit = limit


class TooManyParts(HttpError):
    """A multipart/form-data body with more parts than allowed (refused like a large body)."""

    status = 413
    ends_connection = True

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"multipart/form-data body has more than {limit} parts; the limit is "
            "ABEJA_RUNTIME_MAX_PARTS (--max-parts)"
        )


class ImageTooLarge(HttpError):
    """An image the handler side opened has more pixels than ``--max-image-pixels``."""

    status = 413

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"an image in the request has more than {limit} pixels; the limit is "
            "ABEJA_RUNTIME_MAX_IMAGE_PIXELS (--max-image-pixels)"
        )


class HeadTooLarge(HttpError):
    """A request head (request line and headers) longer than ``--max-head-size``: refused
    before the rest of it is parsed, and the connection closed."""

    status = 431
    ends_connection = True

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"request head larger than {limit} bytes (its request line and headers); send "
            "fewer or shorter headers, or raise the limit, ABEJA_RUNTIME_MAX_HEAD_SIZE "
            "(--max-head-size)"
        )


class BodyTimeout(HttpError):
    """The request's body stopped arriving (a client that stalls, or trickles nothing)."""

    status = 408
    ends_connection = True

    def __init__(self, seconds: float) -> None:
        super().__init__(
            f"request body made no progress for {seconds:g} s; the limit is "
            "ABEJA_RUNTIME_REQUEST_HEAD_TIMEOUT (--request-head-timeout)"
        )


class BodyCannotArriveInTime(HttpError):
    """A body of known length that holds one of the front's places arrives so slowly that it
    could not be whole by the request's deadline even at twice its rate: it is cut then, not at
    the deadline, so its place goes to a body that can still be answered."""

    status = 408
    ends_connection = True

    def __init__(self, rate: float, remaining: int, left: float) -> None:
        super().__init__(
            f"request body arriving at {rate:.0f} bytes/s cannot be received before the "
            f"request's deadline ({remaining} bytes still to come, {left:.0f} s left); send it "
            "faster, or raise ABEJA_RUNTIME_TIMEOUT (--timeout)"
        )


class BodyTooSlow(HttpError):
    """A body that holds one of the front's places for bodies arrives slower than the minimum
    rate (a client trickling a byte now and then held every place, and every other upload
    waited out its deadline)."""

    status = 408
    ends_connection = True

    def __init__(self, rate: float, minimum: int) -> None:
        super().__init__(
            f"request body arriving at {rate:.0f} bytes/s, slower than the {minimum} bytes/s a "
            "body must keep while it holds one of the runtime's places for bodies (one above "
            "64 KiB, chunked or compressed); send it faster, or in one go"
        )


class BodyPastDeadline(HttpError):
    """The request's body was still arriving when its deadline passed (a client trickling a
    byte now and then keeps clear of :class:`BodyTimeout`, not of this)."""

    status = 408
    ends_connection = True

    def __init__(self, seconds: float, *, callers: bool = False) -> None:
        """``callers``: the deadline is the one its caller gave, of ``seconds``."""
        limit = (
            "the deadline its caller gave (a deadline header, or gRPC's own): send the body "
            "sooner, or give a longer one"
            if callers
            else "ABEJA_RUNTIME_TIMEOUT (--timeout)"
        )
        super().__init__(
            f"request body not received within the request's deadline of {seconds:g} s; the "
            f"limit is {limit}"
        )


class InsufficientStorage(HttpError):
    """The disk that holds large request bodies is full."""

    status = 507
    ends_connection = True

    def __init__(self) -> None:
        super().__init__(
            "no space left on the device to hold the request body; free space in the "
            "temporary directory (TMPDIR) or send a smaller body"
        )


class ServiceUnavailable(HttpError):
    status = 503

    def __init__(self, message: str = "service unavailable") -> None:
        super().__init__(message)


class Unauthorized(HttpError):
    """The caller sent no API key, or one the runtime was not given (``--api-keys``)."""

    status = 401

    def __init__(self, sent: bool) -> None:
        super().__init__(
            "the API key sent is not one this model accepts; check the key"
            if sent
            else "this model asks for an API key: send it as `Authorization: Bearer KEY` or "
            "`X-API-Key: KEY`",
            headers={"WWW-Authenticate": 'Bearer realm="abeja-runtime"'},
        )


class ServiceBusy(HttpError):
    """The handler queue is full: the client should retry a little later."""

    status = 503

    def __init__(self, retry_after: int = 1) -> None:
        super().__init__("service busy", headers={"Retry-After": str(retry_after)})


class DeadlineTooNear(ServiceBusy):
    """The caller's deadline comes before the call would even start: refused at once, not
    after a wait for nothing (``service.py``)."""

    def __init__(self, wait: float, left: float) -> None:
        HttpError.__init__(
            self,
            f"the wait for a worker and the call (about {wait:.3g} s) is longer than the "
            f"{left:.3g} s left of the caller's deadline; retry later, or give the call more time",
            headers={"Retry-After": str(max(1, math.ceil(wait)))},
        )


class WorkerCrashed(HttpError):
    """The worker running the request died under it (the front answers for it)."""

    status = 502

    def __init__(self, how: str) -> None:
        super().__init__(
            f"the worker process running this request exited ({how}); it is being replaced: "
            "try again"
        )


class HandlerTimeout(HttpError):
    status = 504

    def __init__(self, timeout: float) -> None:
        # Names the setting: the first thing a user with a slow model needs to know.
        super().__init__(
            f"handler timed out after {timeout:g} s; the limit is ABEJA_RUNTIME_TIMEOUT (--timeout)"
        )
        self.timeout = timeout


class NotStartedInTime(HttpError):
    """The handler process got a call past its latest start (its deadline less the time a call
    takes): its handler is not started."""

    status = 504

    def __init__(self) -> None:
        super().__init__(
            "the call's deadline was too near for its handler to answer in time once a worker "
            "was free (it waited for one); give the call more time (the caller's deadline, or "
            "--timeout)"
        )


class CallerDeadlinePassed(HandlerTimeout):
    """The deadline the caller gave (a header, gRPC's own) passed before an answer."""

    def __init__(self, budget: float) -> None:
        HttpError.__init__(
            self,
            f"no answer within the {budget:g} s the caller's deadline gave (its request's "
            "deadline header, or gRPC's deadline); give the call more time",
        )
        self.timeout = budget


def deadline_passed(budget: float, timeout: float) -> HandlerTimeout:
    """The ``504`` of a call whose deadline passed: the one its caller gave (``budget``
    seconds), or else ``--timeout``'s (``timeout``)."""
    return CallerDeadlinePassed(budget) if budget else HandlerTimeout(timeout)
