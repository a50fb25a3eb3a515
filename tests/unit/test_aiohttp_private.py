"""aiohttp's private names that the front relies on (``front/aiohttp_private.py``) exist on the
installed aiohttp: an upgrade that removes or renames any fails here, with the list of all that
are gone. And the facade does with them what aiohttp's own request loop does: a connection whose
client pipelines more requests than aiohttp's queue holds is served to the end."""

from __future__ import annotations

import asyncio
import types
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.http import RawRequestMessage
from aiohttp.streams import StreamReader

from abeja_runtime.config import Config
from abeja_runtime.front.aiohttp_private import (
    PRIVATE_NAMES,
    HandlerInternals,
    missing_names,
    whole_body,
)
from abeja_runtime.front.connection import Connection
from abeja_runtime.metrics import FrontMetrics


def run(scenario: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(scenario(), timeout=10))


async def _not_found(request: web.BaseRequest) -> web.StreamResponse:
    return web.Response(status=404)


def test_every_private_name_the_front_relies_on_exists() -> None:
    async def scenario() -> list[str]:
        return missing_names()

    missing = run(scenario)
    assert not missing, (
        "the installed aiohttp lacks private names abeja_runtime.front.aiohttp_private "
        "relies on:\n  " + "\n  ".join(missing)
    )


def test_the_facades_attributes_are_aiohttps_slots_as_fast_as_the_private_names() -> None:
    """Each ``aio_*`` name is aiohttp's own ``__slots__`` descriptor: no property, no call, on
    the direct path's reads (an aiohttp without the slot falls back to a slower property)."""
    aliases = {name: value for name, value in vars(HandlerInternals).items() if name[:4] == "aio_"}
    assert aliases
    slow = [
        name for name, value in aliases.items() if not isinstance(value, types.MemberDescriptorType)
    ]
    assert not slow, f"no longer aiohttp's slots (reached by name, slower): {slow}"
    named = {value.__name__ for value in aliases.values()}
    listed = {name for names in PRIVATE_NAMES.values() for name in names}
    assert named <= listed, f"not in PRIVATE_NAMES: {sorted(named - listed)}"


def test_a_replaced_parser_queues_requests_as_aiohttps_own() -> None:
    async def scenario() -> tuple[list[str], int, bool]:
        server = web.Server(_not_found)
        handler = HandlerInternals(server, loop=asyncio.get_running_loop(), max_line_size=100)
        handler.replace_parser()
        handler.data_received(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nPOST /b HTTP/1.1\r\n")
        handler.data_received(b"Host: x\r\nContent-Length: 2\r\n\r\n{}")
        paths = [message.path for message, _ in handler.aio_messages]
        handler.pop_message()
        return paths, len(handler.aio_messages), server.requests_count == 1

    assert run(scenario) == (["/a", "/b"], 1, True)


def test_whole_body_is_the_body_however_it_arrived() -> None:
    """A body parsed from several reads is in several pieces: whole_body joins them all, as
    read_nowait() would read them, in order."""

    async def scenario() -> tuple[bytes, bytes]:
        server = web.Server(_not_found)
        handler = HandlerInternals(server, loop=asyncio.get_running_loop())
        handler.replace_parser()
        head = b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\n"
        for piece in (head + b"abc", b"def", b"ghi"):
            handler.data_received(piece)
        _, payload = handler.aio_messages[0]
        assert payload.is_eof() and len(payload._buffer) == 3  # the pieces as they came
        handler.data_received(head + b"abcdefghi")
        _, twin = handler.aio_messages[1]
        return whole_body(payload), twin.read_nowait()

    assert run(scenario) == (b"abcdefghi", b"abcdefghi")


class _Transport(asyncio.Transport):
    """What a connection writes and whether its reading is paused."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.paused = False
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def write(self, data: Any) -> None:
        self.written += data

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


class _Call:
    def client_gone(self) -> None:
        pass


class _Direct:
    """Takes every request, answered later (one at a time, as the direct path does)."""

    def __init__(self) -> None:
        self.taken: list[str] = []

    def accepts(self, connection: Connection, message: RawRequestMessage, payload: Any) -> int:
        return 0

    def take(
        self,
        connection: Connection,
        message: RawRequestMessage,
        payload: StreamReader,
        captured: int,
    ) -> _Call:
        self.taken.append(message.path)
        return _Call()


def test_more_pipelined_requests_than_aiohttps_queue_holds_are_all_served(tmp_path: Path) -> None:
    """aiohttp holds reading once its queue is full (32 parsed requests) and releases it from
    its own request loop; requests the direct path takes never reach that loop, so the
    connection releases it (release_queue_hold)."""
    count = 100

    async def scenario() -> tuple[list[str], bool]:
        server = web.Server(_not_found)
        direct = _Direct()
        connection = Connection(
            server,
            loop=asyncio.get_running_loop(),
            head_timeout=30,
            stall_timeout=30,
            direct=direct,
            max_head_size=Config().max_head_size,
            metrics=FrontMetrics("test", "main:handler", "abeja", str(tmp_path), lambda: (0, 0)),
        )
        transport = _Transport()
        connection.connection_made(transport)
        await asyncio.sleep(0)  # aiohttp's request loop begins, and waits
        connection.data_received(
            b"".join(f"GET /{n} HTTP/1.1\r\nHost: x\r\n\r\n".encode() for n in range(count))
        )
        for _ in range(count):
            if len(direct.taken) == count and not transport.paused:
                break
            connection.direct_done(close=False)  # the answer is out: the next request
        connection.connection_lost(None)
        return direct.taken, transport.paused

    taken, paused = run(scenario)
    assert taken == [f"/{n}" for n in range(count)]
    assert not paused
