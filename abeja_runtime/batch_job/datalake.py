"""ABEJA Platform's DataLake, as batch mode reads inputs from it and writes answers to it.

A file is named ``{"$datalake:1": "<channel id>/<file id>"}`` (its description, then its bytes
from the description's ``download_uri``), a channel to upload an answer to
``{"$datalake:1": "<channel id>"}``. Credentials, as the platform passes them:
``PLATFORM_AUTH_TOKEN`` (a bearer token), or ``ABEJA_PLATFORM_USER_ID`` with
``ABEJA_PLATFORM_PERSONAL_ACCESS_TOKEN`` (basic auth as ``user-<id>``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

import aiohttp

from abeja_runtime.encode import EncodedResponse
from abeja_runtime.errors import AbejaRuntimeError

__all__ = ["DATALAKE_KEY", "DataLake", "DataLakeError", "datalake_target"]

DATALAKE_KEY: Final = "$datalake:1"
_META_PREFIX: Final = "x-abeja-meta-"


class DataLakeError(AbejaRuntimeError):
    """The DataLake could not be read or written; the text says what to check."""


def datalake_target(text: str) -> str | None:
    """The channel that ``OUTPUT`` names, or None when it names none (empty)."""
    if not text.strip():
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict) or not isinstance(value.get(DATALAKE_KEY), str):
        raise DataLakeError(f'OUTPUT must be {{"{DATALAKE_KEY}": "<channel id>"}}, got {text!r}')
    return str(value[DATALAKE_KEY]).strip("/")


class DataLake:
    """The DataLake API at ``ABEJA_API_URL``, over one client session."""

    def __init__(self, session: aiohttp.ClientSession, environ: Mapping[str, str]) -> None:
        self._session = session
        self._base = environ.get("ABEJA_API_URL", "").rstrip("/")
        self._headers = _authorization(environ)

    def _url(self, path: str) -> str:
        if not self._base:
            raise DataLakeError(
                "INPUT or OUTPUT names the DataLake, but ABEJA_API_URL is not set; set it "
                "(https://api.abeja.io on the platform) with the credentials "
                "(PLATFORM_AUTH_TOKEN, or ABEJA_PLATFORM_USER_ID and "
                "ABEJA_PLATFORM_PERSONAL_ACCESS_TOKEN)"
            )
        return f"{self._base}{path}"

    async def download(self, name: str) -> tuple[bytes, str, dict[str, Any]]:
        """The file ``<channel>/<file>``: its bytes, content type and metadata."""
        channel, _, file_id = name.strip("/").partition("/")
        if not channel or not file_id:
            raise DataLakeError(
                f'INPUT names the DataLake file {name!r}; write it as "<channel id>/<file id>"'
            )
        info = await self._json(self._url(f"/channels/{channel}/{file_id}"))
        uri = info.get("download_uri")
        if not isinstance(uri, str) or not uri:
            raise DataLakeError(f"the DataLake gave no download_uri for the file {name}")
        data = await self._bytes(uri, f"the file {name}")
        metadata = info.get("metadata")
        content_type = info.get("content_type") or "application/octet-stream"
        return data, str(content_type), dict(metadata) if isinstance(metadata, dict) else {}

    async def upload(self, channel: str, file_name: str, reply: EncodedResponse) -> None:
        """The answer as a file of ``channel`` named ``file_name``."""
        headers = dict(self._headers)
        for name, value in reply.headers:
            lowered = name.lower()
            if lowered == "content-type" or lowered.startswith(_META_PREFIX):
                headers[name] = value
        headers[f"{_META_PREFIX}filename"] = file_name
        url = self._url(f"/channels/{channel}/upload")
        status, text = await self._text(
            "POST", url, params={"conflict_target": "filename"}, data=reply.body, headers=headers
        )
        if status > 299:
            raise DataLakeError(
                f"the DataLake refused the upload to channel {channel} ({status}: {text[:200]})"
            )

    async def _text(self, method: str, url: str, **options: Any) -> tuple[int, str]:
        """The status and the text of the DataLake's answer."""
        try:
            async with self._session.request(method, url, **options) as response:
                return response.status, await response.text(errors="replace")
        except aiohttp.ClientError as exc:
            raise DataLakeError(f"cannot reach the DataLake at {url}: {exc}") from None

    async def _json(self, url: str) -> dict[str, Any]:
        status, text = await self._text("GET", url, headers=self._headers)
        if status > 299:
            raise DataLakeError(f"the DataLake answered {status} for {url}: {text[:200]}")
        try:
            found = json.loads(text)
        except json.JSONDecodeError:
            found = None
        if not isinstance(found, dict):
            raise DataLakeError(
                f"the DataLake answered {url} with something other than a JSON object"
            )
        return found

    async def _bytes(self, url: str, what: str) -> bytes:
        try:
            async with self._session.get(url) as response:
                data = await response.read()
                if response.status > 299:
                    raise DataLakeError(f"downloading {what} failed ({response.status})")
        except aiohttp.ClientError as exc:
            raise DataLakeError(f"cannot download {what}: {exc}") from None
        return data


def _authorization(environ: Mapping[str, str]) -> dict[str, str]:
    token = environ.get("PLATFORM_AUTH_TOKEN")
    if token:
        return {"Authorization": f"Bearer {token}"}
    user, secret = (
        environ.get("ABEJA_PLATFORM_USER_ID"),
        environ.get("ABEJA_PLATFORM_PERSONAL_ACCESS_TOKEN"),
    )
    if user and secret:
        login = user if user.startswith("user-") else f"user-{user}"
        return {"Authorization": aiohttp.BasicAuth(login, secret).encode()}
    return {}
