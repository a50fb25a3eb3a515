"""Probe: what taking a 1 MiB body into a shared buffer costs the front, two ways.

A: through aiohttp, as the front does: the ``readchunk()`` loop, each chunk copied into a mapping
   (uvloop's read buffer → bytes → the parser's body bytes → the mapping).
B: the body's bytes never reach a parser: an ``asyncio.BufferedProtocol`` hands uvloop a view of
   the mapping, so the kernel copies the body straight into it (the head is parsed crudely: a
   probe, not a server).

Both answer a small JSON. Run the server pinned to one core and wrk on the other::

    taskset -c 0 python benchmarks/probes/body_into_buffer.py A 18095
    taskset -c 1 wrk -t1 -c16 -d5s -s post_1mib.lua http://127.0.0.1:18095/

and read the server's CPU time per request from /proc (utime + stime) before and after.
"""

import asyncio
import mmap
import sys
from typing import cast

import uvloop

RESP = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
BUF = mmap.mmap(-1, 2 * 1024 * 1024)


async def run_a(port: int) -> None:
    from aiohttp import web

    async def handle(request: web.BaseRequest) -> web.Response:
        offset = 0
        content = request.content
        while True:
            chunk, end = await content.readchunk()
            if not chunk and end is False:
                break
            if not chunk:
                continue
            BUF[offset : offset + len(chunk)] = chunk
            offset += len(chunk)
        return web.Response(body=b"{}", content_type="application/json")

    server = web.Server(handle, access_log=None)
    await asyncio.get_running_loop().create_server(server, "127.0.0.1", port)
    await asyncio.Event().wait()


class Direct(asyncio.BufferedProtocol):
    """Head into a small buffer; a Content-Length body straight into the mmap."""

    def __init__(self) -> None:
        self.head = bytearray()
        self.small = bytearray(64 * 1024)
        self.remaining = 0
        self.offset = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def get_buffer(self, sizehint: int) -> memoryview | bytearray:
        if self.remaining:
            return memoryview(BUF)[self.offset : self.offset + self.remaining]
        return self.small

    def buffer_updated(self, n: int) -> None:
        if self.remaining:
            self.offset += n
            self.remaining -= n
            if not self.remaining:
                self.transport.write(RESP)
            return
        self.head += self.small[:n]
        end = self.head.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self.head[:end]).lower()
        length = int(head.split(b"content-length:")[1].split(b"\r\n")[0])
        got = bytes(self.head[end + 4 :])
        self.head = bytearray()
        BUF[: len(got)] = got
        self.offset = len(got)
        self.remaining = length - len(got)
        if not self.remaining:
            self.transport.write(RESP)


async def run_b(port: int) -> None:
    await asyncio.get_running_loop().create_server(Direct, "127.0.0.1", port)
    await asyncio.Event().wait()


uvloop.run({"A": run_a, "B": run_b}[sys.argv[1]](int(sys.argv[2])))
