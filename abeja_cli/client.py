"""Send the request to the model server (``http.client``: no extra dependency)."""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Final

from abeja_cli.errors import ServerError
from abeja_cli.inputs import ModelRequest
from abeja_runtime.config import Config
from abeja_runtime.options import setting_named

__all__ = ["ModelResponse", "answer_timeout", "send"]

#: The runtime answers 504 itself when a handler runs past its own timeout; the CLI waits this
#: much longer before it gives up on a server that stopped answering altogether.
ANSWER_MARGIN: Final = 30.0
#: While waiting for an answer, a line says so this often, so that no wait is silent.
PROGRESS_EVERY: Final = 15.0


def answer_timeout(model_env: Mapping[str, str]) -> float | None:
    """How long to wait for the answer: the runtime's own timeout (``ABEJA_RUNTIME_TIMEOUT``
    as the model gets it, else its default) plus a margin; ``None`` when it has no limit."""
    try:
        runtime = float(model_env.get(str(setting_named("timeout").envvar), Config.timeout))
    except ValueError:  # the runtime refuses it at start-up, with its own message
        runtime = Config.timeout
    return runtime + ANSWER_MARGIN if runtime > 0 else None


@dataclass(frozen=True)
class ModelResponse:
    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes
    #: Its body was passed on chunk by chunk as it came (``send``'s ``on_chunk``).
    passed_on: bool = False

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def content_type(self) -> str:
        for name, value in self.headers:
            if name.lower() == "content-type":
                return value
        return ""


def send(
    url: str,
    request: ModelRequest,
    *,
    timeout: float | None,
    progress: Callable[[str], None] | None = None,
    on_chunk: Callable[[bytes], None] | None = None,
) -> ModelResponse:
    """One request to the server at ``url``; :class:`ServerError` if it cannot be completed,
    or if no answer came within ``timeout`` seconds (``None``: no limit). ``progress`` gets a
    line every :data:`PROGRESS_EVERY` seconds of waiting. A streamed (chunked) 2xx answer of
    text goes to ``on_chunk`` piece by piece as it arrives (a model that generates text is
    seen generating it), and is kept whole as well."""
    host, _, port = url.removeprefix("http://").partition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        body = request.body if request.body or request.method != "GET" else None
        with _saying_still_waiting(progress):
            conn.request(request.method, request.target, body=body, headers=request.headers)
            response = conn.getresponse()
        headers = response.getheaders()
        if on_chunk is not None and _passed_on(response):
            pieces = []
            while piece := response.read1(_PIECE):
                on_chunk(piece)
                pieces.append(piece)
            return ModelResponse(
                response.status, response.reason, headers, b"".join(pieces), passed_on=True
            )
        return ModelResponse(response.status, response.reason, headers, response.read())
    except TimeoutError:
        raise ServerError(
            f"the model server at {url} did not answer within {timeout:g} s (the runtime's own "
            f"timeout + {ANSWER_MARGIN:g} s) and was stopped; its log above shows what it did. "
            "If the model needs longer, raise --timeout"
        ) from None
    except (OSError, http.client.HTTPException) as exc:
        raise ServerError(
            f"the request to the model server at {url} failed: {exc or type(exc).__name__}"
        ) from None
    finally:
        conn.close()


#: The most one read of a streamed answer takes.
_PIECE: Final = 64 * 1024
#: Streamed answers of these types are passed on as they come (text a person reads).
_TEXT_TYPES: Final = ("text/", "application/x-ndjson", "application/jsonl")


def _passed_on(response: http.client.HTTPResponse) -> bool:
    kind = (response.getheader("Content-Type") or "").lower()
    return response.chunked and 200 <= response.status < 300 and kind.startswith(_TEXT_TYPES)


@contextmanager
def _saying_still_waiting(progress: Callable[[str], None] | None) -> Iterator[None]:
    if progress is None:
        yield
        return
    done = threading.Event()
    started = time.monotonic()

    def tell() -> None:
        while not done.wait(PROGRESS_EVERY):
            progress(f"still waiting for the model's answer ({time.monotonic() - started:.0f} s)")

    thread = threading.Thread(target=tell, name="waiting", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
