"""The warm-up (``--warmup FILE``): request files sent through the handler in each handler
process after it is loaded and before it says :class:`~abeja_runtime.frames.Ready`.

A model that is slow on its first call (lazy set-up, kernels compiled on first use, caches
filled) is then slow here, not on a client's first call; every process warms up, replacements
too. Each file is one request as ``abeja model run-local --input FILE`` sends it
(:mod:`abeja_runtime.request_files`), invoked as a call is (``invoke.py``; other styles answer a
POST to ``/`` as run-local's), where the calls will run (an ``async def`` handler's on its event
loop), a batched handler's in batches of up to its batch size; a streamed body is read to its end.

A warm-up fails when the handler raises, answers a status of 400 or more, or its stream fails:
:class:`WarmupFailed`, one log line that names the file. The process then exits with
:data:`~abeja_runtime.frames.EXIT_WARMUP_FAILED`, and the front replaces it with the back-off of
processes that die before they are ready: readiness stays 503 until a worker is warm. A process
that dies during its warm-up (a segfault, the OOM killer) cannot say so: at the very first start
the front takes it for a handler that cannot be loaded. The log says how long each process took
to load the handler and to warm it up.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import time
from pathlib import Path
from typing import Final

from abeja_runtime.config import Config
from abeja_runtime.encode import EncodedResponse
from abeja_runtime.errors import AbejaRuntimeError
from abeja_runtime.frames import BlockingChannel, Ready
from abeja_runtime.logs import new_request_id, request_id_var
from abeja_runtime.request_files import WARMUP_FILE, RequestFileError, read_request_file
from abeja_runtime.worker.decode import decode_request
from abeja_runtime.worker.invoke import Invoker, chunks
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
        invoker: Invoker,
        channel: BlockingChannel,
        ready: Ready,
        loaded_in: float,
    ) -> None:
        paths = config.warmup
        size = config.max_batch_size if invoker.batched else 1
        self._groups = [paths[start : start + size] for start in range(0, len(paths), size)]
        self._count = len(paths)
        self._invoker = invoker
        self._channel = channel
        self._ready = ready
        self._loaded_in = loaded_in

    async def run(self) -> None:
        """Warm the handler up where its calls run, then say Ready; :class:`WarmupFailed`
        when a request failed."""
        started = time.monotonic()
        for paths in self._groups:
            await self._warm(paths)
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

    async def _warm(self, paths: tuple[str, ...]) -> None:
        """One group of files through the handler, their ids in the handler's log records
        while they run (as a call's are)."""
        requests: list[Request] = []
        try:
            for path in paths:
                requests.append(_request(self._invoker, path))
            token = request_id_var.set(",".join(request.request_id for request in requests))
            try:
                replies = await self._invoker.answer(requests)
                for path, reply in zip(paths, replies, strict=True):
                    if reply.status >= _FAILED_FROM:
                        raise WarmupFailed(_answered(path, reply))
                    if not isinstance(reply.body, bytes):  # read to its end, as a client would
                        try:
                            async for _chunk in chunks(reply.body):
                                pass
                        except Exception as exc:
                            why = f"the streamed answer to {path} failed: {exc}"
                            raise WarmupFailed(why) from exc
            finally:
                request_id_var.reset(token)
        finally:
            for request in requests:
                request.close()


def _request(invoker: Invoker, path: str) -> Request:
    """The request ``abeja model run-local --input PATH`` would send, as the handler gets it."""
    try:
        file = read_request_file(path, Path.cwd(), WARMUP_FILE)
    except RequestFileError as exc:  # it was there when the front started
        raise WarmupFailed(str(exc)) from None
    headers = (("Content-Type", file.content_type), ("Content-Length", str(len(file.body))))
    try:
        return decode_request(
            method="POST",
            raw_path="/",
            raw_query="",
            headers=headers,
            body=io.BytesIO(file.body),
            limits=invoker.limits,
            request_id=new_request_id(),
        )
    except Exception as exc:  # what a client would be answered (400, 413)
        raise WarmupFailed(_answered(path, invoker.error_reply(exc))) from None


def _answered(path: str, reply: EncodedResponse) -> str:
    quoted = ""
    if isinstance(reply.body, bytes) and reply.body:
        quoted = " " + reply.body[:_QUOTED].decode("utf-8", "replace")
    return f"{path} was answered {reply.status}{quoted}"
