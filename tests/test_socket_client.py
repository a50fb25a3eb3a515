"""The benchmarks' socket-timed client (``benchmarks/socket_client.py``): a response fed to it
split at every byte (its body whole, its first line stamped at the read that completed it, no
earlier, no later), and against real servers on 127.0.0.1: every framing, keep-alive reuse,
bytes after an answer, and a server that closes mid-answer."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable

import pytest
from aiohttp import web

from benchmarks.socket_client import Exchange, SocketClient

PIECE = b"data: piece\n\n"


def is_piece(line: bytes) -> bool:
    return line == PIECE.strip()


#: A chunked SSE answer: a role event, then the piece, split across two chunks, then the end.
CHUNKED = (
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n"
    b"c\r\ndata: role\n\n\r\n"
    b"6\r\ndata: \r\n7\r\npiece\n\n\r\n"
    b"e\r\ndata: [DONE]\n\n\r\n"
    b"0\r\n\r\n"
)
BODY = b"data: role\n\ndata: piece\n\ndata: [DONE]\n\n"
#: Where the piece's line ends: the read holding this byte completed it.
PIECE_END = CHUNKED.index(b"piece\n") + len(b"piece")


def fed(reads: list[bytes]) -> tuple[Exchange, list[int]]:
    """An exchange fed ``reads`` in order, each at ``now`` = its index: it and the indexes of
    the reads after which it was done."""

    async def feed() -> tuple[Exchange, list[int]]:
        exchange, done_after = Exchange(is_piece), []
        for index, data in enumerate(reads):
            exchange.received(data, float(index))
            if exchange.done.done():
                done_after.append(index)
        return exchange, done_after

    return asyncio.run(feed())


def reads_split_at(*cuts: int) -> list[bytes]:
    edges = [0, *cuts, len(CHUNKED)]
    return [CHUNKED[start:end] for start, end in itertools.pairwise(edges)]


def test_a_chunked_answer_split_at_any_byte_is_read_whole_and_stamped_where_its_line_ended():
    splits = [reads_split_at(cut) for cut in range(1, len(CHUNKED))]
    splits.append([CHUNKED[at : at + 1] for at in range(len(CHUNKED))])  # every byte alone
    for reads in splits:
        exchange, done_after = fed(reads)
        completed_by = next(
            index for index in range(len(reads)) if sum(map(len, reads[: index + 1])) > PIECE_END
        )
        answer = exchange.done.result()
        assert (answer.status, answer.body) == (200, BODY), reads
        assert done_after == [len(reads) - 1], reads  # done at the last read, not before
        assert answer.arrived == completed_by, reads
        assert exchange.keep_alive


def test_bytes_after_an_answer_s_end_keep_its_connection_from_being_reused():
    exchange, _ = fed([CHUNKED + b"HTTP/1.1 200 OK\r\n"])
    assert exchange.done.result().body == BODY and not exchange.keep_alive
    exchange, _ = fed([b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA"])
    assert exchange.done.result().body == b"ok" and not exchange.keep_alive


def test_an_answer_without_a_body_ends_at_its_head_and_a_malformed_one_is_refused():
    exchange, done_after = fed([b"HTTP/1.1 204 No Content\r\n\r\n"])
    assert (exchange.done.result().body, done_after, exchange.keep_alive) == (b"", [0], True)
    exchange, _ = fed([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX: 1\r\n\r\n"])
    assert exchange.done.result().body == b""  # a trailer section
    with pytest.raises(ValueError, match="not a status line"):
        fed([b"STRAYHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"])
    with pytest.raises(ValueError, match="not followed by CRLF"):
        fed([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nokXY0\r\n\r\n"])


class App:
    """The server: a streamed answer whose first piece is written only once the client has
    read the line before it, and a JSON refusal with a length."""

    def __init__(self) -> None:
        self.role_read = asyncio.Event()
        self.piece_written_at = 0.0
        self.ports: list[int] = []

    async def stream(self, request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        self.ports.append(request.transport.get_extra_info("peername")[1])
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: role\n\n")
        await asyncio.wait_for(self.role_read.wait(), 30)
        self.piece_written_at = time.time()
        await response.write(PIECE)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def refuse(self, request: web.Request) -> web.Response:
        return web.json_response({"error": "no"}, status=400)


async def raw_server(answer: bytes) -> tuple[asyncio.Server, int]:
    """A server that reads a request's head, writes ``answer`` and closes the connection."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def served(test: Callable[[SocketClient, App], Awaitable[None]]) -> None:
    app, handlers = web.Application(), App()
    app.router.add_post("/stream", handlers.stream)
    app.router.add_post("/refuse", handlers.refuse)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    client = SocketClient("127.0.0.1", port)
    try:
        async with asyncio.timeout(60):
            await test(client, handlers)
    finally:
        client.close()
        await runner.cleanup()


def run(test: Callable[[SocketClient, App], Awaitable[None]]) -> None:
    asyncio.run(served(test))


def test_a_stream_is_read_whole_and_its_first_piece_stamped_at_the_read_that_brought_it() -> None:
    async def test(client: SocketClient, app: App) -> None:
        def first(line: bytes) -> bool:
            if line == b"data: role":
                app.role_read.set()  # the piece is written after the client read this line
            return is_piece(line)

        answer = await client.exchange(client.post("/stream", b"{}", {}), first)
        assert answer.status == 200
        assert answer.body == b"data: role\n\n" + PIECE + b"data: [DONE]\n\n"
        assert answer.sent <= app.piece_written_at <= answer.arrived

    run(test)


def test_keep_alive_connections_are_reused_and_a_refusal_is_read_by_its_length() -> None:
    async def test(client: SocketClient, app: App) -> None:
        for _ in range(2):
            app.role_read.set()
            answer = await client.exchange(client.post("/stream", b"{}", {}), is_piece)
            assert answer.arrived >= answer.sent > 0
        assert app.ports[0] == app.ports[1]
        refused = await client.exchange(client.post("/refuse", b"{}", {}), is_piece)
        assert (refused.status, refused.body, refused.arrived) == (400, b'{"error": "no"}', 0.0)

    run(test)


@pytest.mark.parametrize(
    ("answer", "outcome"),
    [
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it", b"all of it"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\nhalf", None),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nhalf\r\n", None),
    ],
    ids=["up-to-the-close", "cut-in-a-length", "cut-in-chunks"],
)
def test_a_body_without_a_length_ends_at_the_close_and_one_cut_short_fails(
    answer: bytes, outcome: bytes | None
) -> None:
    async def test() -> None:
        server, port = await raw_server(answer)
        client = SocketClient("127.0.0.1", port)
        try:
            async with asyncio.timeout(60):
                if outcome is None:
                    with pytest.raises(ConnectionError, match="closed the connection"):
                        await client.exchange(client.post("/", b"", {}), is_piece)
                else:
                    got = await client.exchange(client.post("/", b"", {}), is_piece)
                    assert (got.status, got.body) == (200, outcome)
        finally:
            client.close()
            server.close()
            await server.wait_closed()

    asyncio.run(test())


def test_an_idle_connection_the_server_closed_is_not_reused() -> None:
    async def test() -> None:
        server, port = await raw_server(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        client = SocketClient("127.0.0.1", port)
        try:
            async with asyncio.timeout(60):
                for _ in range(2):  # the second on a new connection: the first was closed
                    got = await client.exchange(client.post("/", b"", {}), is_piece)
                    assert (got.status, got.body) == (200, b"ok")
                    while client.idle:  # the server's close reaches the client
                        await asyncio.sleep(0.001)
        finally:
            client.close()
            server.close()
            await server.wait_closed()

    asyncio.run(test())
