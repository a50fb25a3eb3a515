"""The try-it page of ``run-local-server``: send JSON, text, a file or a form, see the answer.

The page is served by the CLI on a port of its own, so it never shadows a path of the model's
(every path of the service port belongs to the handler). Its requests go to this server under
``/model/...``, which forwards them to the model and passes the answer back as it came (status,
headers, body) with the time it took in ``X-Abeja-Try-Elapsed-Ms``; the page then shows JSON
pretty-printed, images as images, text as text, and anything else as a download.

The page opens on the project's own request (``project_request.py``; the files it names are
served under ``/project-file/``), shows the request as a curl line for the model's port, and,
after each answer, the log lines of that request (``/log/<request id>``, from the CLI's
:class:`~abeja_cli.server_log.LogSink`): a handler's error shows its traceback there, where the
runtime's answer says only ``unexpected error occurred``.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Final

from abeja_cli.project_request import ProjectRequest
from abeja_runtime.media import guess_content_type

if TYPE_CHECKING:
    from abeja_cli.server_log import LogSink

__all__ = ["TryPage"]

_PAGE_FILE: Final = Path(__file__).resolve().parent / "try_page.html"
#: Headers that describe one hop, not the answer: not passed back to the page.
_HOP: Final = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length"})
_TIMEOUT: Final = 300.0
#: The most one read of a streamed answer takes before it is passed on.
_PIECE: Final = 64 * 1024
#: The longest wait for a request's log lines: their end (the access record) comes within
#: the runtime's 0.05 s batch; a turned-off access log never sends it.
_LOG_WAIT: Final = 3.0
_JSON: Final = {"Content-Type": "application/json"}


def _script_json(value: object) -> str:
    """``value`` as JavaScript inside ``<script>``: JSON that cannot end the element."""
    return json.dumps(value).replace("</", "<\\/")


class TryPage:
    """The page's server, on 127.0.0.1, in a daemon thread; ``url`` once started.

    ``request`` is what the page opens on (its files are read from ``project``); ``log``, the
    server's log, gives each answer its log lines; ``port`` is the page's (0: a free one; an
    ``OSError`` when it cannot be bound).
    """

    def __init__(
        self,
        model_url: str,
        request: ProjectRequest | None = None,
        *,
        project: Path | None = None,
        log: LogSink | None = None,
        port: int = 0,
    ) -> None:
        request = request or ProjectRequest()
        page = (
            _PAGE_FILE.read_text("utf-8")
            .replace("__REQUEST__", _script_json(request.to_json()))
            .replace("__MODEL_URL__", _script_json(model_url.rstrip("/")))
        )
        target = urllib.parse.urlsplit(model_url)
        files = {name: project / name for name in request.files()} if project else {}
        handler: type[_Handler] = type(
            "_Handler",
            (_Handler,),
            {
                "page": page.encode(),
                "host": target.hostname,
                "port": target.port,
                "files": files,
                "log": log,
            },
        )
        self._server = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self._server.daemon_threads = True
        bound = int(self._server.server_address[1])
        handler.page_port = bound
        self.url = f"http://127.0.0.1:{bound}/"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="try-page", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class _Handler(BaseHTTPRequestHandler):
    page: bytes = b""
    host: str | None = None
    port: int | None = None
    #: The page's own port: requests must name it (see _refused).
    page_port: int = 0
    #: The project files the page may fetch, by name: those of its request, no others.
    files: ClassVar[Mapping[str, Path]] = {}
    log: LogSink | None = None
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the model's own access log already shows each request."""

    def _refused(self) -> bool:
        """Only the page itself may use this server: another site the user visits must not
        drive the local model through it. A request naming another host (DNS rebinding: a
        page of evil.example whose name now resolves to 127.0.0.1) or sent from another
        origin (a form or fetch of that page) is answered 403."""
        port = self.page_port
        ours = {f"127.0.0.1:{port}", f"localhost:{port}"}
        origin = self.headers.get("Origin")
        site = self.headers.get("Sec-Fetch-Site")
        if (
            self.headers.get("Host") in ours
            and (origin is None or origin.removeprefix("http://") in ours)
            and site in (None, "same-origin", "none")
        ):
            return False
        self._answer(
            403,
            {"Content-Type": "text/plain; charset=utf-8"},
            f"forbidden: the try-it page serves only itself, at http://127.0.0.1:{port}/".encode(),
        )
        return True

    def do_GET(self) -> None:
        if self._refused():
            return
        if self.path in ("/", "/index.html"):
            self._answer(200, {"Content-Type": "text/html; charset=utf-8"}, self.page)
        elif self.path.startswith("/model/"):
            self._forward()
        elif self.path.startswith("/project-file/"):
            self._project_file(urllib.parse.unquote(self.path.removeprefix("/project-file/")))
        elif self.path.startswith("/log/"):
            self._request_log(urllib.parse.unquote(self.path.removeprefix("/log/")))
        else:
            self._answer(404, {"Content-Type": "text/plain"}, b"not found")

    def _project_file(self, name: str) -> None:
        path = self.files.get(name)
        try:
            data = path.read_bytes() if path is not None else None
        except OSError:
            data = None
        if data is None:
            self._answer(404, {"Content-Type": "text/plain"}, b"not found")
        else:
            self._answer(200, {"Content-Type": guess_content_type(name)}, data)

    def _request_log(self, request_id: str) -> None:
        """The log lines of one request: ``{"lines": [...], "complete": bool}``."""
        lines: list[str] = []
        complete = False
        if self.log is not None:
            lines, complete = self.log.request_lines(request_id, timeout=_LOG_WAIT)
        self._answer(200, _JSON, json.dumps({"lines": lines, "complete": complete}).encode())

    def do_POST(self) -> None:
        if not self._refused():
            self._forward()

    do_PUT = do_PATCH = do_DELETE = do_POST

    def _forward(self) -> None:
        if not self.path.startswith("/model/"):
            self._answer(404, {"Content-Type": "text/plain"}, b"not found")
            return
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {}
        if self.headers.get("Content-Type"):
            headers["Content-Type"] = self.headers["Content-Type"]
        path = self.path.removeprefix("/model") or "/"
        began = time.monotonic()
        connection = http.client.HTTPConnection(self.host or "127.0.0.1", self.port, _TIMEOUT)
        try:
            connection.request(self.command, path, body=body, headers=headers)
            answer = connection.getresponse()
            elapsed = (time.monotonic() - began) * 1000
            passed = {k: v for k, v in answer.getheaders() if k.lower() not in _HOP}
            passed["X-Abeja-Try-Elapsed-Ms"] = f"{elapsed:.1f}"
            if answer.chunked:  # streamed: passed on as it comes (the page shows it so)
                self._relay(answer, passed)
                return
            data = answer.read()
        except (OSError, http.client.HTTPException) as exc:
            message = json.dumps({"status": f"the model did not answer: {exc}"}).encode()
            self._answer(502, _JSON, message)
            return
        finally:
            connection.close()
        self._answer(answer.status, passed, data)

    def _relay(self, answer: http.client.HTTPResponse, headers: dict[str, str]) -> None:
        """A streamed answer, each piece passed on as it arrives; its end is the end of the
        connection. ``X-Abeja-Try-Elapsed-Ms`` is then the time to its head."""
        self.close_connection = True
        self._head(answer.status, headers)
        self.send_header("Cache-Control", "no-store")
        # Else the browser holds the first bytes back to sniff what they are.
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Connection", "close")
        self.end_headers()
        while piece := answer.read1(_PIECE):
            self.wfile.write(piece)
            self.wfile.flush()

    def _head(self, status: int, headers: Mapping[str, str]) -> None:
        """The status line and ``headers``, with this server's ``Server`` and ``Date`` only
        where ``headers`` have none: a model's answer passed on keeps its own, and no header
        comes twice."""
        self.send_response_only(status)
        given = {name.lower() for name in headers}
        if "server" not in given:
            self.send_header("Server", self.version_string())
        if "date" not in given:
            self.send_header("Date", self.date_time_string())
        for name, value in headers.items():
            self.send_header(name, value)

    def _answer(self, status: int, headers: dict[str, str], body: bytes) -> None:
        """A whole answer, with its length."""
        self._head(status, headers)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)
