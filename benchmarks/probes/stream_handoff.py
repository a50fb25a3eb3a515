"""Probe: the front off a stream's path. The front reads a request, then hands the client's
socket to the handler process (``SCM_RIGHTS``), which writes the streamed answer to the client
itself and gives the socket back at its end; the front reads the connection's next request.

    python -m benchmarks.probes.stream_handoff [--runs 3] [--seconds 6] [--firsts 200]
        [--targets handoff,one-process,bare,runtime]

Today every chunk of a stream crosses the front: the worker's write, the front's read, its
write to the client, each a system call and a turn of the other process on a core they share,
which is why the runtime's time to first token at 64 paced streams is about twice the bare
app's (``benchmarks.openai_streams``). This probe is the design that would take the front off
the chunks, at its smallest: two processes (a front and a worker, forked, on uvloop) with no
admission, records or limits, serving ``handlers/chat``'s generator as OpenAI's chunks, as
``peers/bare_openai.py`` does in one process. Targets, alternated run by run:

* ``handoff``: that front and its worker;
* ``one-process``: the same front answering the streams itself, no worker (the control: what
  the hand-written HTTP costs, against aiohttp's, apart from the second process);
* ``bare``: ``peers/bare_openai.py``, aiohttp in one process;
* ``runtime``: the runtime itself, as ``benchmarks.openai_streams`` starts it.

Each is pinned to ``--server-cores`` and measured from ``--client-cores`` with
``benchmarks.openai_streams``' client: streams one at a time, then paced streams (0.02 s
between pieces) arriving open-loop, 64 in flight on average, after a second not recorded (its
connections opened); each figure the median of the runs. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from abeja_runtime.launch import free_port
from benchmarks.batching import Peer
from benchmarks.openai_streams import (
    HANDLER_DIR,
    PATH,
    PIECES,
    Serving,
    bare_server,
    body,
    one_at_a_time,
    open_loop,
    quantile,
    runtime_server,
    serving,
)
from benchmarks.socket_client import SocketClient

#: What the front sends the worker with a client's socket: the connection's number, the body.
_ID = 4


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(head: dict[str, Any], delta: dict[str, str], finish: str | None) -> bytes:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    document = {**head, "choices": [choice]}
    return _chunk(b"data: " + json.dumps(document, separators=(",", ":")).encode() + b"\n\n")


async def _answer(client: socket.socket, request: bytes) -> None:
    """The streamed answer to a chat ``request``, written to ``client`` (head, role and first
    piece in one write, then a write a piece)."""
    sys.path.insert(0, str(HANDLER_DIR))
    from main import pace, pieces  # type: ignore[import-not-found]  # the chat model

    loop = asyncio.get_running_loop()
    seconds = pace(json.loads(request).get("metadata"))
    head = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": "toy",
    }
    out = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
        + _event(head, {"role": "assistant", "content": ""}, None)
    )
    for index, piece in enumerate(pieces()):
        if index and seconds:
            await asyncio.sleep(seconds)
        await loop.sock_sendall(client, out + _event(head, {"content": piece}, None))
        out = b""
    done = _event(head, {}, "stop") + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
    await loop.sock_sendall(client, done)


async def _worker(channel: socket.socket) -> None:
    """Each socket handed over: the answer written to it, then the socket handed back."""
    loop = asyncio.get_running_loop()
    ended = loop.create_future()
    answering: set[asyncio.Task[None]] = set()

    async def answer(fd: int, number: int, request: bytes) -> None:
        client = socket.socket(fileno=fd)
        try:
            await _answer(client, request)
        finally:
            client.close()  # this process's copy; the front's stays open
            await loop.sock_sendall(channel, number.to_bytes(_ID, "big"))

    def readable() -> None:
        while True:
            try:
                message, fds, _, _ = socket.recv_fds(channel, 65536, 1)
            except BlockingIOError:
                return
            if not message:
                loop.remove_reader(channel.fileno())
                ended.set_result(None)
                return
            number = int.from_bytes(message[:_ID], "big")
            task = loop.create_task(answer(fds[0], number, message[_ID:]))
            answering.add(task)
            task.add_done_callback(answering.discard)

    loop.add_reader(channel.fileno(), readable)
    await ended


def _request(buffer: bytearray) -> tuple[str, bytes] | None:
    """The first whole request in ``buffer`` (taken out of it): its head and body."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = bytes(buffer[:end]).decode("latin-1")
    length = 0
    for line in head.split("\r\n")[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    if len(buffer) < end + 4 + length:
        return None
    request = bytes(buffer[end + 4 : end + 4 + length])
    del buffer[: end + 4 + length]
    return head, request


class _Front:
    """Requests read from each connection; a chat request's socket handed to the worker (with
    ``channel``; else answered here), and read again once it comes back."""

    def __init__(self, channel: socket.socket | None) -> None:
        self._channel = channel
        self._loop = asyncio.get_running_loop()
        self._connections: dict[int, tuple[socket.socket, bytearray]] = {}
        self._answering: set[asyncio.Task[None]] = set()

    async def serve(self, port: int) -> None:
        listener = socket.create_server(("127.0.0.1", port), backlog=1024)
        listener.setblocking(False)
        self._loop.add_reader(listener.fileno(), self._accept, listener)
        if self._channel is not None:
            self._loop.add_reader(self._channel.fileno(), self._handed_back)
        await self._loop.create_future()  # until it is stopped

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except BlockingIOError:
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._connections[sock.fileno()] = (sock, bytearray())
            self._loop.add_reader(sock.fileno(), self._readable, sock.fileno())

    def _handed_back(self) -> None:
        assert self._channel is not None
        while True:
            try:
                data = self._channel.recv(4096)
            except BlockingIOError:
                return
            if not data:  # the worker is gone
                self._loop.remove_reader(self._channel.fileno())
                return
            self._back(int.from_bytes(data[:_ID], "big"))

    def _back(self, number: int) -> None:
        if number in self._connections:
            self._loop.add_reader(number, self._readable, number)
            self._readable(number)  # a request that came meanwhile

    async def _here(self, number: int, sock: socket.socket, request: bytes) -> None:
        try:
            await _answer(sock, request)
        finally:
            self._back(number)

    def _readable(self, number: int) -> None:
        sock, buffer = self._connections[number]
        with contextlib.suppress(BlockingIOError):
            data = sock.recv(65536)
            if not data:
                self._loop.remove_reader(number)
                del self._connections[number]
                sock.close()
                return
            buffer += data
        if (found := _request(buffer)) is None:
            return
        head, request = found
        if not head.startswith(f"POST {PATH} "):
            sock.send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            return
        self._loop.remove_reader(number)  # the answer's until it is over
        if self._channel is None:
            task = self._loop.create_task(self._here(number, sock, request))
            self._answering.add(task)
            task.add_done_callback(self._answering.discard)
            return
        socket.send_fds(self._channel, [number.to_bytes(_ID, "big") + request], [sock.fileno()])


async def _front(port: int, channel: socket.socket | None) -> None:
    await _Front(channel).serve(port)


def serve(port: int, *, one_process: bool) -> None:
    """The front here, its worker forked (a socket pair of messages between them); or the
    front alone, answering the streams itself."""
    import uvloop

    if one_process:
        uvloop.run(_front(port, None))
        return
    front_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    front_end.setblocking(False)
    worker_end.setblocking(False)
    if os.fork() == 0:
        front_end.close()
        uvloop.run(_worker(worker_end))
        os._exit(0)
    worker_end.close()
    uvloop.run(_front(port, front_end))


TARGETS = ("handoff", "one-process", "bare", "runtime")
#: Each peer target's command after ``python``, its port last.
_PEERS = {
    "handoff": ["-m", "benchmarks.probes.stream_handoff", "--serve"],
    "one-process": ["-m", "benchmarks.probes.stream_handoff", "--serve-alone"],
}


def _server(target: str, args: argparse.Namespace, tmp: Path) -> Serving:
    if target == "runtime":
        return runtime_server(args, tmp)
    if target == "bare":
        return bare_server(args, tmp)
    port = free_port()
    pinned = ["taskset", "-c", args.server_cores, sys.executable, *_PEERS[target], str(port)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return Peer(target, pinned, env, tmp, tmp / f"{target}-{port}.log", port, "/health")


async def _measure(port: int, args: argparse.Namespace) -> tuple[float, float]:
    """Added time to first token p50 (ms): one stream at a time, and open-loop paced streams."""
    client = SocketClient("127.0.0.1", port)
    try:
        alone = await one_at_a_time(client, args.firsts, 30)
        rate = args.streams / ((PIECES - 1) * 0.02)
        paced, _ = await open_loop(client, rate, args.seconds, 30, body(0.02), warmup=1)
    finally:
        client.close()
    if alone.failed or paced.failed:
        raise RuntimeError(f"streams failed: {alone.first_error or paced.first_error}")
    return quantile(alone.added, 0.5) * 1000, quantile(paced.added, 0.5) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.probes.stream_handoff")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6)
    parser.add_argument("--firsts", type=int, default=200)
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--server-cores", default="1")
    parser.add_argument("--client-cores", default="0")
    parser.add_argument("--ready-timeout", type=float, default=30)
    parser.add_argument("--stop-timeout", type=float, default=10)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the servers themselves
    parser.add_argument("--serve-alone", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve or args.serve_alone:
        serve(args.serve or args.serve_alone, one_process=bool(args.serve_alone))
        return
    args.streams, args.runtime_args = 64, ""  # the runtime as benchmarks.openai_streams runs it
    os.sched_setaffinity(0, {int(cpu) for cpu in args.client_cores.split(",")})
    import uvloop

    targets = [name for name in args.targets.split(",") if name in TARGETS]
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name in targets}
    with tempfile.TemporaryDirectory(prefix="abeja-stream-handoff-") as tmp:
        for run in range(args.runs):
            for name in targets:
                with serving(_server(name, args, Path(tmp)), args) as server:
                    figures[name].append(uvloop.run(_measure(server.port, args)))
                alone, paced = figures[name][-1]
                print(f"run {run + 1}: {name} {alone:.3f} ms alone, {paced:.3f} ms open loop")
    for name, runs in figures.items():
        alone = statistics.median(figure[0] for figure in runs)
        paced = statistics.median(figure[1] for figure in runs)
        print(
            f"{name}: added time to first token p50 {alone:.3f} ms one at a time, "
            f"{paced:.3f} ms at 64 paced streams in flight (open loop); median of {args.runs}"
        )


if __name__ == "__main__":
    main()
