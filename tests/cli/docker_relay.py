"""The Docker engine's socket, relayed, to see each container as the engine holds it when the
CLI starts it.

The CLI under test (a subprocess whose ``DOCKER_HOST`` names the relay) talks to the real engine
through it, byte for byte, both ways; only a request to start a container waits while the relay
inspects that container, with the test's own client, then goes on. A container whose start fails
(a GPU request on a machine without one) is removed by the CLI a moment later: before its start
is the one moment its configuration can be read, however fast the CLI is.
"""

from __future__ import annotations

import re
import socket
import threading
from pathlib import Path
from typing import Any, Final

__all__ = ["DockerRelay"]

#: The request line of ``POST /containers/{id}/start`` (docker-py puts the API version first).
_START: Final = re.compile(rb"POST /(?:v[0-9.]+/)?containers/([A-Za-z0-9_.-]+)/start ")
#: Bytes of one read kept for the next, so that a request line split between two is found.
_KEPT: Final = 256


class DockerRelay:
    """Listens on ``<directory>/docker.sock``; :attr:`started` holds, in order, the inspection
    of every container a start was asked for."""

    def __init__(self, directory: Path, client: Any, engine: str) -> None:
        self.path = directory / "docker.sock"
        self.started: list[dict[str, Any]] = []
        self._client = client
        self._engine = engine
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(self.path))
        self._listener.listen()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def host(self) -> str:
        """``DOCKER_HOST`` for the CLI."""
        return f"unix://{self.path}"

    def close(self) -> None:
        self._listener.close()  # the connections end with the CLI that holds them

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed
                return
            engine = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            engine.connect(self._engine)
            threading.Thread(target=self._pass, args=(engine, client), daemon=True).start()
            threading.Thread(target=self._requests, args=(client, engine), daemon=True).start()

    def _requests(self, client: socket.socket, engine: socket.socket) -> None:
        kept = b""
        with client, engine:
            while data := _read(client):
                seen = kept + data
                for match in _START.finditer(seen):
                    if match.end() > len(kept):  # not found in the previous read already
                        self.started.append(self._client.api.inspect_container(match[1].decode()))
                kept = seen[-_KEPT:]
                if not _send(engine, data):
                    return

    @staticmethod
    def _pass(engine: socket.socket, client: socket.socket) -> None:
        while (data := _read(engine)) and _send(client, data):
            pass
        try:
            client.shutdown(socket.SHUT_WR)  # the engine closed: so does the relay, to the CLI
        except OSError:  # the CLI is gone
            return


def _read(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:  # closed by the other direction's thread
        return b""


def _send(sock: socket.socket, data: bytes) -> bool:
    try:
        sock.sendall(data)
    except OSError:  # the other side is gone
        return False
    return True
