"""``--reload``: notice when a project's ``.py`` files change, by polling their mtimes, and
answer for the model while an edit broke it.

Polling needs no extra dependency, works the same on bind mounts and network drives, and a
project holds few Python files; twice a second is quick enough for an edit-and-retry loop.
"""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Final

from abeja_cli.images import EXCLUDED_DIRS
from abeja_cli.server_log import LoggedError

__all__ = ["ChangeWatcher", "StandIn", "unavailable_body"]

#: What a stand-in reads of a request's body before answering: enough for the client to
#: see the 503 rather than a reset connection; a larger rest is left unread.
_BODY_READ: Final = 1024 * 1024
_READ_TIMEOUT: Final = 5.0
#: How often the stand-in's loop looks for :meth:`StandIn.stop`: the restart after a fix
#: waits for it.
_POLL: Final = 0.05

_Snapshot = dict[Path, tuple[int, int]]


class ChangeWatcher:
    """Reports the files (matching ``suffixes``) added, removed or modified since last asked."""

    def __init__(self, root: Path, suffixes: tuple[str, ...] = (".py",)) -> None:
        self.root = root
        self.suffixes = suffixes
        self._snapshot = self._scan()

    def _scan(self) -> _Snapshot:
        snapshot: _Snapshot = {}
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = [d for d in dirnames if d not in EXCLUDED_DIRS and not d.startswith(".")]
            for name in filenames:
                if name.endswith(self.suffixes):
                    path = Path(dirpath, name)
                    try:
                        stat = path.stat()
                    except OSError:
                        continue  # removed between listing and stat: seen as removed
                    snapshot[path] = (stat.st_mtime_ns, stat.st_size)
        return snapshot

    def changes(self) -> list[Path]:
        """Paths changed since the previous call (or since creation), sorted."""
        current = self._scan()
        previous, self._snapshot = self._snapshot, current
        changed = {p for p in current.keys() | previous.keys() if current.get(p) != previous.get(p)}
        return sorted(changed)


def unavailable_body(error: LoggedError | None, fallback: str, code_file: str) -> bytes:
    """The 503 answer while the model server cannot start: the error it logged when it gave
    up (``fallback`` when it logged none), and what to do about it."""
    message = error.message if error is not None else fallback
    status = (
        f"the model server is not running: {message.rstrip('.')}. Fix {code_file} and save it: "
        "run-local-server restarts the model server when a .py file of the project changes."
    )
    traceback = error.traceback if error is not None else None
    return json.dumps({"status": status, "error": message, "traceback": traceback}).encode()


class StandIn:
    """On the model's port while the model server cannot start: every request is answered
    ``503`` with ``body``, so that a client (the try-it page, curl, a test) learns why instead of
    finding the port closed. Binds at once (``OSError`` when the port is taken); :meth:`stop`
    frees the port for the model server again."""

    def __init__(self, port: int, body: bytes) -> None:
        handler: type[_Unavailable] = type("_Unavailable", (_Unavailable,), {"body": body})
        self._server = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            args=(_POLL,),
            name="reload-stand-in",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class _Unavailable(BaseHTTPRequestHandler):
    body: bytes = b""
    protocol_version = "HTTP/1.1"
    timeout = _READ_TIMEOUT

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the terminal said once why the model is not there."""

    def _unavailable(self) -> None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = 0
        if 0 < length <= _BODY_READ:
            self.rfile.read(length)
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(self.body)
        self.close_connection = True

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _unavailable
