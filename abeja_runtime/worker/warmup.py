"""The warm-up (``--warmup FILE``): request files sent through the handler in each handler
process after it is loaded and before it says :class:`~abeja_runtime.frames.Ready`, so that a
model slow on its first call is slow here, not on a client's first call.

Each file is one request as ``abeja model run-local --input FILE`` sends it, invoked where the
calls will run, a batched handler's in batches; a streamed body is read to its end. A request
that fails (the handler raises, answers 400 or more, or its stream fails) fails the warm-up:
:class:`WarmupFailed`, and the process exits for the front to replace it.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import time
from dataclasses import dataclass
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


@dataclass
class Warmup:
    """One handler process's warm-up, then its :class:`Ready` to the front."""

    config: Config
    invoker: Invoker
    channel: BlockingChannel
    ready: Ready
    #: How this process came by its handler, for its log line: "loaded the handler in 2.10 s".
    loaded: str

    async def run(self) -> None:
        """Warm the handler up where its calls run, then say Ready; :class:`WarmupFailed`
        when a request failed."""
        started = time.monotonic()
        paths, count = self.config.warmup, len(self.config.warmup)
        size = self.config.max_batch_size if self.invoker.batched else 1
        for start in range(0, count, size):
            await self._warm(paths[start : start + size])
        if count:
            _log.info(
                "worker %d %s and warmed it up with %d request%s in %.2f s",
                os.getpid(),
                self.loaded,
                count,
                "" if count == 1 else "s",
                time.monotonic() - started,
            )
        else:
            _log.info("worker %d %s", os.getpid(), self.loaded)
        # A front that stopped meanwhile is gone: the process reads the end of its input next,
        # and the handler's teardown still runs.
        with contextlib.suppress(OSError):
            self.channel.write(self.ready)

    async def _warm(self, paths: tuple[str, ...]) -> None:
        """One group of files through the handler, their ids in the handler's log records
        while they run (as a call's are)."""
        requests: list[Request] = []
        try:
            for path in paths:
                requests.append(_request(self.invoker, path))
            token = request_id_var.set(",".join(request.request_id for request in requests))
            try:
                replies = await self.invoker.answer(requests)
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
