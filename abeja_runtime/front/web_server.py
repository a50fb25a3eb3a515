"""The front's aiohttp servers (:func:`make_web_server`), and the cap on the service port's
connections (:func:`connection_cap`): one more is answered ``503`` and closed, so that idle
clients never take the descriptors the health port needs for its probes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import resource
import socket
import time
from typing import Any, Final

from aiohttp import __version__ as aiohttp_version
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http import RawRequestMessage
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from aiohttp.web_server import Server

from abeja_runtime.config import Config
from abeja_runtime.front.aiohttp_private import missing_names
from abeja_runtime.front.answer_file import AnswerFile
from abeja_runtime.front.body import BODIES_AHEAD
from abeja_runtime.front.connection import Connection, DirectPath, PublicConnection
from abeja_runtime.front.ports import BACKLOG
from abeja_runtime.front.request_heads import closing_answer
from abeja_runtime.metrics import FrontMetrics

__all__ = ["SocketServer", "connection_cap", "make_web_server"]

_log = logging.getLogger("abeja_runtime")

_TOO_MANY_CONNECTIONS_RESPONSE: Final = closing_answer(
    503,
    "too many connections are open; retry on a connection you keep open (keep-alive)",
    "Retry-After: 1",
)
#: Descriptors kept free below the process's limit for everything but client connections: the
#: health port's connections, the handler processes' sockets and pidfds, metrics files; and one
#: more for each place a body may hold at once (its buffer or spool file), but never more than
#: half the limit (an async worker at --concurrency 1000 has a thousand places, which would
#: otherwise leave its thousand clients no room).
_RESERVED_FDS: Final = 64
_warned_at = 0.0


class SocketServer:
    """An aiohttp server on a bound socket, as aiohttp's ``ServerRunner`` and ``SockSite`` run
    one, without their module, which imports aiohttp's application framework (its router, file
    answers, websockets): a fifth of aiohttp's import, on the runtime's way to its first answer.
    """

    def __init__(self, server: Server, sock: socket.socket) -> None:
        self.server = server
        self._sock = sock
        self._listening: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        # (It listens again, with this backlog: the one the socket was made with.)
        self._listening = await loop.create_server(self.server, sock=self._sock, backlog=BACKLOG)

    def stop_accepting(self) -> None:
        """New connections are refused; those open stay."""
        if self._listening is not None:
            self._listening.close()

    async def close(self, timeout: float = 1.0) -> None:
        """Stop accepting, then close the connections, those answering within ``timeout``."""
        self.stop_accepting()
        await asyncio.sleep(0)  # what was accepted begins to be handled
        self.server.pre_shutdown()
        await self.server.shutdown(timeout)


def connection_cap(config: Config) -> int | None:
    """The most client connections the service port keeps open, counting as one more each big
    answer a slow client is still taking (its memfd, ``answer_file.py``): what the open-files
    limit leaves after the front's own needs (``None``: no limit to keep below)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return None
    places = config.workers * (config.concurrency + BODIES_AHEAD)
    return max(soft // 2, soft - _RESERVED_FDS - places)


class _Server(Server):
    """aiohttp's low-level server, whose connections are ``connection``s made with ``options``,
    refusing those past ``max_connections``."""

    def __init__(
        self,
        handler: Any,
        *,
        connection: type[Connection],
        options: dict[str, Any],
        max_connections: int | None,
    ) -> None:
        factory = None if connection is PublicConnection else self._request  # None: aiohttp's
        super().__init__(handler, request_factory=factory, handler_cancellation=True)
        self._event_loop = asyncio.get_running_loop()
        self._connection = connection
        self._options = options
        self._max_connections = max_connections

    def _request(
        self,
        message: RawRequestMessage,
        payload: StreamReader,
        protocol: RequestHandler,
        writer: AbstractStreamWriter,
        task: asyncio.Task[None],
    ) -> BaseRequest:
        """The request aiohttp's loop is to serve, made as aiohttp makes it, its connection told
        (:meth:`Connection.aiohttp_serves`)."""
        assert isinstance(protocol, Connection)
        protocol.aiohttp_serves()
        return BaseRequest(message, payload, protocol, writer, task, self._event_loop)

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        most = self._max_connections
        if most is not None and len(self.connections) + AnswerFile.held > most:
            # Each connection holds a descriptor, and so does each big answer a slow client
            # is still taking (its memfd): past the cap, the health port could not accept its
            # probes, nor the front open a body's buffer.
            transport.write(_TOO_MANY_CONNECTIONS_RESPONSE)
            handler.force_close()
            _warn_too_many_connections(most)

    def __call__(self) -> Connection:
        return self._connection(self, loop=self._event_loop, **self._options)


def make_web_server(
    handler: Any, config: Config, metrics: FrontMetrics, direct: DirectPath | None = None
) -> Server:
    """A low-level aiohttp server (no router or middleware) with the front's connections: the
    direct path when given, unless the installed aiohttp lacks a private name it needs (then
    one warning says so, and every connection is a :class:`PublicConnection`); no lingering read
    of a body nobody will use (the 413 path reads a bounded amount itself); a request whose
    client left cancelled (its call is withdrawn); bodies as sent (the service decodes a
    ``Content-Encoding`` itself)."""
    public = _aiohttp_lacks_private_names()
    return _Server(
        handler,
        connection=PublicConnection if public else Connection,
        options={
            "access_log": None,
            "auto_decompress": False,
            "keepalive_timeout": config.keepalive_timeout,
            "lingering_time": 0,
            "head_timeout": config.request_head_timeout,
            "stall_timeout": config.request_head_timeout,
            "max_head_size": config.max_head_size,
            "metrics": metrics,
            "direct": None if public else direct,
        },
        # The service port only: the health port answers probes whatever clients hold open.
        max_connections=connection_cap(config) if direct is not None else None,
    )


@functools.cache
def _aiohttp_lacks_private_names() -> bool:
    """Whether the installed aiohttp lacks a private name the direct path needs (said once)."""
    missing = missing_names()
    if missing:
        _log.warning(
            "the installed aiohttp %s lacks %s, which the direct path needs: every request goes "
            "through aiohttp's public request handling instead, slower and with only aiohttp's "
            "own limits on request heads; install a supported aiohttp (%s)",
            aiohttp_version,
            ", ".join(missing),
            _aiohttp_wanted(),
        )
    return bool(missing)


def _aiohttp_wanted() -> str:
    import importlib.metadata  # only here: 0.6 MiB that the front otherwise never holds

    with contextlib.suppress(importlib.metadata.PackageNotFoundError):  # a source tree's
        wanted = importlib.metadata.requires("abeja-runtime") or []
        return ", ".join(r for r in wanted if r.startswith("aiohttp"))
    return "see pyproject.toml"


def _warn_too_many_connections(most: int) -> None:
    """Said once a minute at most: a flood of refusals is one line, not thousands."""
    global _warned_at
    now = time.monotonic()
    if now - _warned_at >= 60:
        _warned_at = now
        _log.warning(
            "the service port has %d connections open, as many as this process's open-files "
            "limit (ulimit -n) leaves room for; new ones get 503 until some close. Raise the "
            "limit, or put a balancer that reuses connections in front",
            most,
        )
