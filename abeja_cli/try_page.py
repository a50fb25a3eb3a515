"""The try-it page of ``run-local-server``: send JSON, text, a file or a form, see the answer.

The page is served by the CLI on a port of its own, so it never shadows a path of the model's
(every path of the service port belongs to the handler). Its requests go to this server under
``/model/...``, which forwards them to the model and passes the answer back as it came (status,
headers, body) with the time it took in ``X-Abeja-Try-Elapsed-Ms``; the page then shows JSON
pretty-printed, images as images, text as text, and anything else as a download.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Final

__all__ = ["TryPage"]

_PAGE_FILE: Final = Path(__file__).resolve().parent / "try_page.html"
#: Headers that describe one hop, not the answer: not passed back to the page.
_HOP: Final = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length"})
_TIMEOUT: Final = 300.0


class TryPage:
    """The page's server, on 127.0.0.1, in a daemon thread; ``url`` once started."""

    def __init__(self, model_url: str, example: str = "") -> None:
        page = _PAGE_FILE.read_text("utf-8").replace("__EXAMPLE__", json.dumps(example))
        target = urllib.parse.urlsplit(model_url)
        handler: type[_Handler] = type(
            "_Handler",
            (_Handler,),
            {"page": page.encode(), "host": target.hostname, "port": target.port},
        )
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        port = int(self._server.server_address[1])
        handler.page_port = port
        self.url = f"http://127.0.0.1:{port}/"
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
        else:
            self._answer(404, {"Content-Type": "text/plain"}, b"not found")

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
            data = answer.read()
        except (OSError, http.client.HTTPException) as exc:
            message = json.dumps({"status": f"the model did not answer: {exc}"}).encode()
            self._answer(502, {"Content-Type": "application/json"}, message)
            return
        finally:
            connection.close()
        elapsed = (time.monotonic() - began) * 1000
        passed = {k: v for k, v in answer.getheaders() if k.lower() not in _HOP}
        passed["X-Abeja-Try-Elapsed-Ms"] = f"{elapsed:.1f}"
        self._answer(answer.status, passed, data)

    def _answer(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)
