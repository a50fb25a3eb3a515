"""Async requests' jobs (ABEJA's ARMS): answered ``202`` at once, their calls run with no client
waiting, their answers sent to the platform (:class:`~abeja_runtime.front.arms.ResultSender`).

A job is a call like any other (:class:`~abeja_runtime.front.call.FrontCall`): queued, run,
timed out or refused by the same rules; its responder (an :class:`~abeja_runtime.front.call.
AwaitedAnswer`) keeps its answer for the job's task, which sends it (or ABEJA's failure
document) and then finishes the call. A graceful shutdown waits for the results to be sent.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from aiohttp.web_request import BaseRequest
from aiohttp.web_response import Response, StreamResponse

from abeja_runtime.config import PlatformIds
from abeja_runtime.encode import EncodedResponse, error_reply
from abeja_runtime.errors import BadRequest, HttpError, ServiceBusy
from abeja_runtime.frames import Answer, Call
from abeja_runtime.front.arms import (
    ASYNC_ID_HEADER,
    ASYNC_TOKEN_HEADER,
    MAX_PENDING,
    ResultSender,
    async_id_problem,
)
from abeja_runtime.front.call import AwaitedAnswer, FrontCall
from abeja_runtime.front.web_responder import WebResponder
from abeja_runtime.logs import REQUEST_ID_HEADER

if TYPE_CHECKING:
    from abeja_runtime.front.body import Body
    from abeja_runtime.front.service import CallService

__all__ = ["AsyncJobs"]

_log = logging.getLogger("abeja_runtime")
_JSON: Final = (("Content-Type", "application/json"),)


class _AsyncRequestsOff(HttpError):
    status = 501


class AsyncJobs:
    """The async requests of the service port, and their jobs."""

    def __init__(
        self,
        platform: PlatformIds,
        service: CallService,
        frame: Callable[[BaseRequest, FrontCall, Body], Call],
    ) -> None:
        missing = ResultSender.missing(platform)
        self._off = (
            f"async requests need {', '.join(missing)} to send their results to; set them, or "
            f"send the request without {ASYNC_ID_HEADER}"
            if missing
            else None
        )
        self._results = ResultSender(platform)
        self._service = service
        self._frame = frame
        self._jobs: set[asyncio.Task[None]] = set()

    async def accept(self, request: BaseRequest, call: FrontCall, async_id: str) -> StreamResponse:
        """Answer ``call`` (its body read) ``202`` now, its job begun; or refuse it."""
        problem = async_id_problem(async_id)
        refusal: HttpError | None = (
            BadRequest(problem)
            if problem
            else _AsyncRequestsOff(self._off)
            if self._off
            else ServiceBusy()
            if len(self._jobs) >= MAX_PENDING
            else None
        )
        responder = call.responder
        assert isinstance(responder, WebResponder)
        if refusal is not None:
            call.refuse(refusal)
            return await responder.response(call)
        body, call.body = call.body, None  # the job's now
        assert body is not None
        entry = call.entry
        service = self._service
        to_platform = AwaitedAnswer(service.loop)
        job_trace = None if entry.trace is None else entry.trace.job(async_id)
        job = service.begin_job(call, job_trace, to_platform)
        job.submit(self._frame(request, job, body), body)
        token = request.headers.get(ASYNC_TOKEN_HEADER) or ""
        task = asyncio.create_task(self._send(job, to_platform, async_id, token))
        self._jobs.add(task)
        task.add_done_callback(self._jobs.discard)
        entry.count(202)
        response = Response(status=202, headers=(*_JSON, (REQUEST_ID_HEADER, entry.request_id)))
        response.force_close()
        return response

    async def _send(
        self, job: FrontCall, to_platform: AwaitedAnswer, async_id: str, token: str
    ) -> None:
        """Send the job's answer (or ABEJA's failure document) to the platform, then finish the
        job's call; its span ends with the result's status once it is sent."""
        status = 500  # the job failed, unless a reply is sent
        entry = job.entry
        try:
            result = await to_platform.result
            if isinstance(result, HttpError):  # a timeout or a full queue: as a client's
                reply = error_reply(result)
            else:
                assert isinstance(result, Answer) and job.ticket is not None
                if result.failed:  # logged in the handler process
                    await self._results.send_failure(async_id, token, "response from runtime")
                    return
                data = result.body
                file = job.ticket.answer_file
                if result.streamed:
                    data = b"".join([chunk async for chunk in job.ticket.stream()])
                elif data is None and file is not None:  # a big body
                    data = file.read()
                assert data is not None
                reply = EncodedResponse(result.status, result.headers, data)
            status = reply.status
            tag = (REQUEST_ID_HEADER, entry.request_id)
            await self._results.send_result(async_id, token, reply.with_headers((tag,)))
        except asyncio.CancelledError:
            job.client_left()
            raise
        except Exception:
            _log.exception("async request %s failed", async_id)
            await self._results.send_failure(async_id, token, "response from runtime")
        finally:
            job.finish()
            if entry.trace is not None:
                entry.trace.status(status)
                entry.trace.end()
            self._service.accounting.release()
