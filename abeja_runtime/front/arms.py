"""ABEJA Platform's async requests (ARMS): results sent to the platform API, not to the client.

A request with a non-empty ``x-abeja-arms-async-request-id`` header is answered ``202`` at once
(contract Part B 1.8); its handler runs like any other call, and its answer is then ``PUT`` to
``{ABEJA_API_URL}/organizations/{ABEJA_ORGANIZATION_ID}/deployments/{ABEJA_DEPLOYMENT_ID}/results/
{async request id}`` with the request's ``x-abeja-arms-async-request-token`` as a bearer token:
a ``multipart/form-data`` body of three parts, ``status``, ``headers`` (JSON, the headers a
synchronous answer would have, without ``Content-Length``) and ``body``. A handler that fails
sends ABEJA's failure document instead. Up to three attempts, with exponential back-off,
none after a 429. Unlike ABEJA Platform, a graceful shutdown waits (within the grace period) for
the results still pending.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import Final

import aiohttp

from abeja_runtime.config import PlatformIds
from abeja_runtime.encode import EncodedResponse

__all__ = [
    "ASYNC_ID_HEADER",
    "ASYNC_TOKEN_HEADER",
    "MAX_PENDING",
    "ResultSender",
    "async_id_problem",
]

_log = logging.getLogger("abeja_runtime")

ASYNC_ID_HEADER: Final = "x-abeja-arms-async-request-id"
ASYNC_TOKEN_HEADER: Final = "x-abeja-arms-async-request-token"
#: Async requests a worker holds at once (ABEJA's channel capacity); more get 503.
MAX_PENDING: Final = 10_000
#: The ids an async request may carry: one path segment of the result's URL, never more (a
#: ``../`` or ``?`` in it would send the result, with the caller's token, somewhere else).
_ASYNC_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_ATTEMPTS: Final = 3
_FIRST_BACKOFF: Final = 1.0
#: Seconds one attempt may take. aiohttp's client classes are looked up only when a result is
#: sent: the front loads that half of aiohttp on first use (:mod:`.lean_aiohttp`).
_TIMEOUT_SECONDS: Final = 30.0


def async_id_problem(async_id: str) -> str | None:
    """Why ``async_id`` cannot name a result, or ``None`` when it can."""
    if _ASYNC_ID.fullmatch(async_id):
        return None
    return (
        f"{ASYNC_ID_HEADER} must be 1 to 128 letters, digits, '.', '_' or '-', starting with a "
        "letter or a digit"
    )


class ResultSender:
    """Sends the results of async requests to the platform API of ``platform``."""

    def __init__(self, platform: PlatformIds) -> None:
        self._base = (
            f"{platform.api_url.rstrip('/')}/organizations/{platform.organization_id}"
            f"/deployments/{platform.deployment_id}/results"
        )

    @staticmethod
    def missing(platform: PlatformIds) -> list[str]:
        """The variables that async requests need and that are not set."""
        wanted = {
            "ABEJA_API_URL": platform.api_url,
            "ABEJA_ORGANIZATION_ID": platform.organization_id,
            "ABEJA_DEPLOYMENT_ID": platform.deployment_id,
        }
        return [name for name, value in wanted.items() if not value]

    async def send_result(self, async_id: str, token: str, reply: EncodedResponse) -> None:
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

    async def send_failure(self, async_id: str, token: str, what: str) -> None:
        """ABEJA's failure document: the handler (or the runtime) could not answer."""
        document = {
            "status": 502,
            "headers": {"content-type": "application/json"},
            "body": {
                "error": "internal_server_error",
                "error_description": f"Internal Server Error: unexpected error of {what}",
            },
        }
        payload = aiohttp.BytesPayload(
            json.dumps(document, indent=2).encode(), content_type="application/json"
        )
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
