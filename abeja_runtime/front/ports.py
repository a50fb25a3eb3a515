"""The front's listening sockets, bound before anything else starts (:func:`listen`), each
failure one sentence that names the port and the setting that changes it."""

from __future__ import annotations

import errno
import os
import socket
from typing import Final

from abeja_runtime.config import Config
from abeja_runtime.settings import settings_of

__all__ = ["BACKLOG", "listen"]

#: The connections the kernel holds for a port until the front accepts them (gunicorn's and
#: uvicorn's 2048): a burst of a thousand clients is taken, none of them dropped to a SYN retry
#: a second later.
BACKLOG: Final = 2048


def listen(host: str, port: int, setting: str) -> socket.socket:
    """A socket listening on ``host:port``; else ``OSError`` with one sentence for the log that
    names the port and the flag and variable of ``setting`` (``grpc_port``) that change it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        sock = socket.create_server((host, port), family=family, backlog=BACKLOG)
    except OSError as exc:
        declared = {declared.name: declared for declared in settings_of(Config)}
        change = f"{declared[setting].flag} ({declared[setting].envvar})"
        serving = {"port": "HTTP", "healthcheck_port": "health checks", "grpc_port": "gRPC"}
        cannot = f"cannot listen for {serving[setting]} on {host}:{port}"
        if exc.errno == errno.EADDRINUSE:
            raise OSError(
                f"{cannot}: port {port} is in use by another program; stop it or choose "
                f"another with {change}"
            ) from None
        # The system's words alone: create_server's own message repeats the address.
        code = exc.errno or 0
        reason = os.strerror(code) if code > 0 else exc.strerror or str(exc)
        where = f"{declared['host'].flag} ({declared['host'].envvar})"
        raise OSError(f"{cannot} ({reason}); check {where} and {change}") from None
    sock.set_inheritable(True)
    return sock
