"""The warm-up (``--warmup FILE``): request files sent through the handler in each handler
process after it is loaded and before the process says :class:`~abeja_runtime.frames.Ready`.

A model that is slow on its first call (lazy set-up, kernels compiled on first use, caches filled)
is then slow here, and not on a client's call just after readiness said 200; a replacement (a
crashed or recycled worker) warms up too, as every process does it. Each file is one request as
``abeja model run-local --input FILE`` sends it (:mod:`abeja_runtime.request_files`): a POST to
``/`` of the file's bytes with the media type of its name. It goes through
:class:`~abeja_runtime.worker.calls.HandlerCalls` as a call does: the request built, the handler
called with a fresh context, its answer encoded and a streamed body read to its end; an
``async def`` handler on the event loop its calls run on, a batched handler in batches of up to its
batch size. Other styles get it through their handler the same way (KServe's and Seldon's adapters
answer a POST to ``/`` as run-local's).

A warm-up fails when the handler raises, answers a status of 400 or more, or its stream fails:
:class:`WarmupFailed`, one log line that names the file. The process then exits with
:data:`~abeja_runtime.frames.EXIT_WARMUP_FAILED`, and the front replaces it with the back-off of
processes that die before they are ready, also at the first start (where a handler that cannot
be imported stops the front): readiness stays 503 until a worker is warm, and a failure that
passes heals. A process that dies during its warm-up instead (a segfault, the OOM killer)
cannot say so: at the very first start the front takes it for a handler that cannot be loaded,
as it would one that crashes on import. The log says how long each process took to load the
handler and to warm it up.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Final

from abeja_runtime.config import Config
from abeja_runtime.encode import EncodedResponse
from abeja_runtime.errors import AbejaRuntimeError
from abeja_runtime.frames import BlockingChannel, Ready
from abeja_runtime.logs import new_request_id, request_id_var
from abeja_runtime.request_files import WARMUP_FILE, RequestFileError, read_request_file
from abeja_runtime.worker.calls import HandlerCalls
from abeja_runtime.worker.request import Request

__all__ = ["Warmup", "WarmupFailed"]

_log = logging.getLogger("abeja_runtime")
#: A warm-up answered with this status or above failed: a client's call would have failed too.
_FAILED_FROM: Final = 400
#: How much of a failed answer's body its log line quotes (an error's ``{"status": ...}``).
_QUOTED: Final = 200


class WarmupFailed(AbejaRuntimeError):
    """A warm-up request failed; the message, one line for the log, says which and how."""

    def __init__(self, why: str) -> None:
        super().__init__(
            f"worker {os.getpid()} failed its warm-up: {why}; it stays out of readiness and "
            "exits, and the front starts a replacement, which warms up again"
        )


class Warmup:
    """One handler process's warm-up, then its :class:`Ready` to the front."""

    def __init__(
        self,
        config: Config,
        calls: HandlerCalls,
        channel: BlockingChannel,
        ready: Ready,
        loaded_in: float,
    ) -> None:
        paths = config.warmup
        size = config.max_batch_size if calls.batched else 1
        self._groups = [paths[start : start + size] for start in range(0, len(paths), size)]
        self._count = len(paths)
        self._calls = calls
        self._channel = channel
        self._ready = ready
        self._loaded_in = loaded_in

    def run(self) -> None:
        """Warm a ``def`` handler up on this thread, then say Ready; :class:`WarmupFailed`
        when a request failed."""
        started = time.monotonic()
        calls = self._calls
        for paths in self._groups:
            with _Requests(calls, paths) as requests:
                if calls.batched:
                    replies = calls.answer_batch(requests)
                else:
                    replies = [calls.answer(requests[0])]
                for path, reply in zip(paths, replies, strict=True):
                    _check(path, reply)
                    _read_to_end(path, reply)
        self._say_ready(started)

    async def run_async(self) -> None:
        """The same on the running event loop (an ``async def`` handler, or a style whose
        gRPC service is async), the one its calls run on."""
        started = time.monotonic()
        calls = self._calls
        for paths in self._groups:
            with _Requests(calls, paths) as requests:
                if calls.batched:  # batching is the abeja style's: on the loop, async
                    replies = await calls.answer_batch_async(requests)
                elif calls.handler.is_async:
                    replies = [await calls.answer_async(requests[0])]
                else:
                    replies = [calls.answer(requests[0])]
                for path, reply in zip(paths, replies, strict=True):
                    _check(path, reply)
                    await _read_to_end_async(path, reply)
        self._say_ready(started)

    def _say_ready(self, started: float) -> None:
        """The process's line of the start-up log (how long loading and warming up took),
        then :class:`Ready`."""
        if self._count:
            _log.info(
                "worker %d loaded the handler in %.2f s and warmed it up with %d request%s in "
                "%.2f s",
                os.getpid(),
                self._loaded_in,
                self._count,
                "" if self._count == 1 else "s",
                time.monotonic() - started,
            )
        else:
            _log.info("worker %d loaded the handler in %.2f s", os.getpid(), self._loaded_in)
        # A front that stopped meanwhile is gone: the process reads the end of its input next,
        # and the handler's teardown still runs.
        with contextlib.suppress(OSError):
            self._channel.write(self._ready)


class _Requests:
    """The requests of a group of files, their ids in the handler's log records while they
    run (as a call's are), closed at the end."""

    def __init__(self, calls: HandlerCalls, paths: tuple[str, ...]) -> None:
        self._calls = calls
        self._paths = paths
        self._requests: list[Request] = []

    def __enter__(self) -> list[Request]:
        try:
            for path in self._paths:
                self._requests.append(_request(self._calls, path))
        except BaseException:
            self._close()
            raise
        ids = ",".join(request.request_id for request in self._requests)
        self._token = request_id_var.set(ids)
        return self._requests

    def __exit__(self, *exc_info: object) -> None:
        request_id_var.reset(self._token)
        self._close()

    def _close(self) -> None:
        for request in self._requests:
            request.close()


def _request(calls: HandlerCalls, path: str) -> Request:
    """The request ``abeja model run-local --input PATH`` would send, as the handler gets it."""
    try:
        file = read_request_file(path, Path.cwd(), WARMUP_FILE)
    except RequestFileError as exc:  # it was there when the front started
        raise WarmupFailed(str(exc)) from None
    headers = (("Content-Type", file.content_type), ("Content-Length", str(len(file.body))))
    try:
        return calls.request(
            method="POST",
            raw_path="/",
            raw_query="",
            headers=headers,
            body=io.BytesIO(file.body),
            request_id=new_request_id(),
        )
    except Exception as exc:  # what a client would be answered (400, 413)
        raise WarmupFailed(_answered(path, calls.error_reply(exc))) from None


def _check(path: str, reply: EncodedResponse) -> None:
    if reply.status >= _FAILED_FROM:
        raise WarmupFailed(_answered(path, reply))


def _answered(path: str, reply: EncodedResponse) -> str:
    quoted = ""
    if isinstance(reply.body, bytes) and reply.body:
        quoted = " " + reply.body[:_QUOTED].decode("utf-8", "replace")
    return f"{path} was answered {reply.status}{quoted}"


def _read_to_end(path: str, reply: EncodedResponse) -> None:
    """A streamed answer read to its end, as a client would (a ``def`` handler's async
    generator on a loop of its own, as its calls' are)."""
    body = reply.body
    if isinstance(body, bytes):
        return
    if isinstance(body, AsyncIterator):
        from abeja_runtime.worker.handler_loop import run_until_done  # asyncio only then

        run_until_done(_read_to_end_async(path, reply))
        return
    try:
        for _chunk in body:
            pass
    except Exception as exc:
        raise WarmupFailed(f"the streamed answer to {path} failed: {exc}") from exc
    finally:
        close = getattr(body, "close", None)
        if callable(close):
            close()


async def _read_to_end_async(path: str, reply: EncodedResponse) -> None:
    body = reply.body
    if not isinstance(body, AsyncIterator):
        _read_to_end(path, reply)
        return
    try:
        async for _chunk in body:
            pass
    except Exception as exc:
        raise WarmupFailed(f"the streamed answer to {path} failed: {exc}") from exc
    finally:
        aclose = getattr(body, "aclose", None)
        if callable(aclose):
            await aclose()
