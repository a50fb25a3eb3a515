"""An OTLP/HTTP receiver that takes every export: where the traced runtime's spans go in the
benchmark (``runtime-traced``), which keeps nothing, so that its cost is the runtime's own
(spans made, batched, encoded and sent), not a collector's; the tests give it a function that
decodes what it takes (``tests/helpers/otlp.py``)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["otlp_sink", "sink_handler"]


def sink_handler(take: Callable[[bytes], None] | None) -> type[BaseHTTPRequestHandler]:
    """The sink's request handler: ``200`` to an export (its body to ``take``, if given),
    ``404`` to anything else."""

    class Sink(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # the exporter keeps its connection

        def do_POST(self) -> None:
            data = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            protobuf = self.headers.get("Content-Type") == "application/x-protobuf"
            found = self.path == "/v1/traces" and protobuf
            if found and take is not None:
                take(data)  # an ExportTraceServiceRequest
            self.send_response(200 if found else 404)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    return Sink


@contextlib.contextmanager
def otlp_sink(take: Callable[[bytes], None] | None = None) -> Iterator[str]:
    """The sink's endpoint (``http://127.0.0.1:PORT``), for ``OTEL_EXPORTER_OTLP_ENDPOINT``;
    each export's body goes to ``take``, if given."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), sink_handler(take))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
