"""ABEJA Platform's async requests (ARMS, :class:`AsyncJobs`): answered ``202`` at once, their
calls run with no client waiting, their results sent to the platform API, not to the client.

A request with a non-empty ``x-abeja-arms-async-request-id`` header is answered ``202`` at once
(contract Part B 1.8). Its job is a call like any other (:class:`~abeja_runtime.front.call.
FrontCall`): queued, run, timed out or refused by the same rules; its responder keeps its answer
for the job's task, which ``PUT``s it to ``{ABEJA_API_URL}/organizations/{ABEJA_ORGANIZATION_ID}
/deployments/{ABEJA_DEPLOYMENT_ID}/results/{async request id}`` with the request's
``x-abeja-arms-async-request-token`` as a bearer token: a ``multipart/form-data`` body of three
parts, ``status``, ``headers`` (JSON, the headers a synchronous answer would have, without
``Content-Length``) and ``body``. A handler that fails sends ABEJA's failure document instead.
Up to three attempts, with exponential back-off, none after a 429. Unlike ABEJA Platform, a
graceful shutdown waits (within the grace period) for the results still pending.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

import aiohttp
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import Response, StreamResponse

from abeja_runtime.config import PlatformIds
from abeja_runtime.encode import EncodedResponse, error_reply
from abeja_runtime.errors import BadRequest, HttpError, ServiceBusy
from abeja_runtime.frames import Answer, Call
from abeja_runtime.front.accounting import CallEntry
from abeja_runtime.front.call import AwaitedAnswer, FrontCall
from abeja_runtime.front.web_responder import WebResponder
from abeja_runtime.logs import REQUEST_ID_HEADER

if TYPE_CHECKING:
    from abeja_runtime.front.body import Body
    from abeja_runtime.front.service import CallService

__all__ = ["ASYNC_ID_HEADER", "AsyncJobs"]

_log = logging.getLogger("abeja_runtime")

ASYNC_ID_HEADER: Final = "x-abeja-arms-async-request-id"
_TOKEN_HEADER: Final = "x-abeja-arms-async-request-token"
#: Async requests a worker holds at once (ABEJA's channel capacity); more get 503.
_MAX_PENDING: Final = 10_000
#: The ids an async request may carry: one path segment of the result's URL, never more (a
#: ``../`` or ``?`` in it would send the result, with the caller's token, somewhere else).
_ASYNC_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_ATTEMPTS: Final = 3
_FIRST_BACKOFF: Final = 1.0
#: Seconds one attempt may take. aiohttp's client classes are looked up only when a result is
#: sent: the front loads that half of aiohttp on first use (:mod:`.lean_aiohttp`).
_TIMEOUT_SECONDS: Final = 30.0
_JSON: Final = (("Content-Type", "application/json"),)
_ERROR: Final = "Internal Server Error: unexpected error of response from runtime"
_FAILURE: Final = json.dumps(
    {
        "status": 502,
        "headers": {"content-type": "application/json"},
        "body": {"error": "internal_server_error", "error_description": _ERROR},
    },
    indent=2,
).encode()


class _AsyncRequestsOff(HttpError):
    status = 501


class AsyncJobs:
    """The async requests of the service port, their jobs, and the sending of their results."""

    def __init__(
        self,
        platform: PlatformIds,
        service: CallService,
        frame: Callable[[BaseRequest, FrontCall, Body], Call],
    ) -> None:
        wanted = {
            "ABEJA_API_URL": platform.api_url,
            "ABEJA_ORGANIZATION_ID": platform.organization_id,
            "ABEJA_DEPLOYMENT_ID": platform.deployment_id,
        }
        missing = [name for name, value in wanted.items() if not value]
        self._off = (
            f"async requests need {', '.join(missing)} to send their results to; set them, or "
            f"send the request without {ASYNC_ID_HEADER}"
            if missing
            else None
        )
        self._base = (
            f"{platform.api_url.rstrip('/')}/organizations/{platform.organization_id}"
            f"/deployments/{platform.deployment_id}/results"
        )
        self._service = service
        self._frame = frame
        self._jobs: set[asyncio.Task[None]] = set()

    async def accept(self, request: BaseRequest, call: FrontCall, async_id: str) -> StreamResponse:
        """Answer ``call`` (its body read) ``202`` now, its job begun; or refuse it."""
        refusal: HttpError | None = (
            BadRequest(
                f"{ASYNC_ID_HEADER} must be 1 to 128 letters, digits, '.', '_' or '-', starting "
                "with a letter or a digit"
            )
            if not _ASYNC_ID.fullmatch(async_id)
            else _AsyncRequestsOff(self._off)
            if self._off
            else ServiceBusy()
            if len(self._jobs) >= _MAX_PENDING
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
        to_platform = AwaitedAnswer(self._service.loop)
        job = self._job(call, async_id, to_platform)
        job.submit(self._frame(request, job, body), body)
        token = request.headers.get(_TOKEN_HEADER) or ""
        task = asyncio.create_task(self._send(job, to_platform, async_id, token))
        self._jobs.add(task)
        task.add_done_callback(self._jobs.discard)
        entry.count(202)
        response = Response(status=202, headers=(*_JSON, (REQUEST_ID_HEADER, entry.request_id)))
        response.force_close()
        return response

    def _job(self, answered: FrontCall, async_id: str, responder: AwaitedAnswer) -> FrontCall:
        """The call of the job of ``answered``'s request: its entry counted already (the
        ``202``), its span the job's, its tenant and class the request's, its deadline
        ``--timeout``'s. The drain waits for it until its result is sent (its entry's end)."""
        request = answered.entry
        accounting = self._service.accounting
        entry = CallEntry(
            accounting, "POST", request.path, request.received, request.request_id,
            request.requester_id,
        )  # fmt: skip
        entry.status = 202  # (counted: its span's status is its result's, set when it is sent)
        entry.trace = None if request.trace is None else request.trace.job(async_id)
        if request.noted and "caller" in request.noted:  # (its tenant, with api-key tenants)
            entry.note("caller", request.noted["caller"])
        accounting.hold()
        call = FrontCall(self._service, entry, responder)
        timeout = self._service.timeout
        call.deadline = None if timeout is None else request.received + timeout
        call.tenant, call.priority = answered.tenant, answered.priority
        return call

    async def _send(
        self, job: FrontCall, to_platform: AwaitedAnswer, async_id: str, token: str
    ) -> None:
        """Send the job's answer (or ABEJA's failure document) to the platform, then finish the
        job's call; its span ends with the result's status once it is sent."""
        status = 500  # the job failed, unless a reply is sent
        trace = job.entry.trace
        left = False  # the task was cancelled (the front stops)
        try:
            result = await to_platform.result
            if isinstance(result, HttpError):  # a timeout or a full queue: as a client's
                reply = error_reply(result)
            else:
                assert isinstance(result, Answer) and job.ticket is not None
                if result.failed:  # logged in the handler process
                    await self._send_failure(async_id, token)
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
            tag = (REQUEST_ID_HEADER, job.entry.request_id)
            await self._send_result(async_id, token, reply.with_headers((tag,)))
        except asyncio.CancelledError:
            left = True
            raise
        except Exception:
            _log.exception("async request %s failed", async_id)
            await self._send_failure(async_id, token)
        finally:
            if trace is not None:  # before its span ends with the call
                trace.status(status)
            if left:
                job.client_left()
            job.finish()

    async def _send_result(self, async_id: str, token: str, reply: EncodedResponse) -> None:
        """The handler's answer, as the three parts the platform expects."""
        assert isinstance(reply.body, bytes), "an async result is collected before it is sent"
        headers = {name: value for name, value in reply.headers if name.lower() != "content-length"}
        content_type = reply.header("Content-Type", "text/plain")
        with aiohttp.MultipartWriter("form-data") as form:
            for name, data, part_type in (
                ("status", str(reply.status).encode(), "text/plain"),
                ("headers", json.dumps(headers).encode(), "application/json"),
                ("body", reply.body, content_type),
            ):
                # ABEJA's parts: the name unquoted, as the platform has always received it.
                form.append(
                    data,
                    {"Content-Disposition": f"form-data; name={name}", "Content-Type": part_type},
                )
            await self._put(async_id, token, form, f"status {reply.status}")

    async def _send_failure(self, async_id: str, token: str) -> None:
        """ABEJA's failure document: the handler (or the runtime) could not answer."""
        payload = aiohttp.BytesPayload(_FAILURE, content_type="application/json")
        await self._put(async_id, token, payload, "a failure")

    async def _put(self, async_id: str, token: str, data: aiohttp.Payload, what: str) -> None:
        """PUT with retries; a result that cannot be delivered is logged, never raised."""
        url = f"{self._base}/{async_id}"
        headers = {"Authorization": f"Bearer {token}"}
        delay = _FIRST_BACKOFF
        async with aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=_TIMEOUT_SECONDS)
        ) as session:
            for attempt in range(1, _ATTEMPTS + 1):
                try:
                    async with session.put(url, data=data, headers=headers) as response:
                        await response.read()
                        status = response.status
                except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                    problem = f"{type(exc).__name__}: {exc}"
                else:
                    if status < 300:
                        _log.info("sent %s of async request %s to the platform", what, async_id)
                        return
                    problem = f"the platform answered {status}"
                    if status == 429:  # the platform asks us to stop: as ABEJA Platform, no retry
                        break
                if attempt < _ATTEMPTS:
                    await asyncio.sleep(delay)
                    delay *= 2
        _log.error(
            "could not send %s of async request %s to %s after %d attempt(s): %s",
            what,
            async_id,
            url,
            attempt,
            problem,
        )
