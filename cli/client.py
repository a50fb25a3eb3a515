"""Send the request to the model server (``http.client``: no extra dependency)."""

from __future__ import annotations

import http.client
from dataclasses import dataclass
from typing import Final

from abeja_cli.errors import ServerError
from abeja_cli.inputs import ModelRequest

__all__ = ["ModelResponse", "send"]

#: The runtime answers 504 itself when a handler runs past its own timeout (60 s by default);
#: this only guards against a server that stops answering altogether.
REQUEST_TIMEOUT: Final = 3600.0


@dataclass(frozen=True)
class ModelResponse:
    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def content_type(self) -> str:
        for name, value in self.headers:
            if name.lower() == "content-type":
                return value
        return ""


def send(url: str, request: ModelRequest, *, timeout: float = REQUEST_TIMEOUT) -> ModelResponse:
    """One request to the server at ``url``; :class:`ServerError` if it cannot be completed."""
    host, _, port = url.removeprefix("http://").partition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        body = request.body if request.body or request.method != "GET" else None
        conn.request(request.method, request.target, body=body, headers=request.headers)
        response = conn.getresponse()
        return ModelResponse(
            response.status, response.reason, response.getheaders(), response.read()
        )
    except (OSError, http.client.HTTPException) as exc:
        raise ServerError(
            f"the request to the model server at {url} failed: {exc or type(exc).__name__}"
        ) from None
    finally:
        conn.close()
