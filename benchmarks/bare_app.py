"""Baseline server: the benchmark workloads written directly as aiohttp handlers.

This is what the runtime is compared against, so it is deliberately plain: no thread pool,
no body spooling, no handler indirection. The numpy workload runs inline on the event loop
(it is ~1 ms), and imports ``work`` from the numpy handler so both targets do identical work.

Routes: POST /small_json, /binary, /numpy_1ms, /upload; GET /health_check (on both ports).
``--loop uvloop`` runs it on uvloop, the runtime's loop when uvloop is installed.

``--workers N`` starts N processes in total (this one plus N-1 forked children), each with
its own listening sockets bound with SO_REUSEPORT, so the kernel spreads connections
across them. That is the simplest honest multi-process setup aiohttp supports.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import importlib.util
import json
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

HERE = Path(__file__).resolve().parent
NUMPY_HANDLER = HERE / "handlers" / "numpy_1ms" / "main.py"
PR_SET_PDEATHSIG = 1


def _load_numpy_work() -> Callable[[float], float]:
    """Import the numpy handler's ``work`` by path, so the matrix size lives in one place."""
    spec = importlib.util.spec_from_file_location("bench_numpy_1ms", NUMPY_HANDLER)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {NUMPY_HANDLER}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    work: Callable[[float], float] = module.work
    return work


async def health_check(request: web.Request) -> web.Response:
    """Readiness probe with the same shape as the runtime's."""
    return web.json_response({"status": "ok"})


async def small_json(request: web.Request) -> web.Response:
    """Same as handlers/small_json: parse a tiny JSON body, return a computed value."""
    body = json.loads(await request.read())
    return web.Response(
        text=json.dumps({"total": body["total_without_tax"] * 1.08}),
        content_type="application/json",
        charset="utf8",
    )


async def _count_body(request: web.Request, chunk_size: int) -> int:
    """Stream the body in fixed-size reads, as the handlers do with request.read(n)."""
    n = 0
    while chunk := await request.content.read(chunk_size):
        n += len(chunk)
    return n


async def binary(request: web.Request) -> web.Response:
    """Same as handlers/binary: read the body in 64 KiB chunks, return its size."""
    return web.json_response({"size": await _count_body(request, 65536)})


async def upload(request: web.Request) -> web.Response:
    """Same as handlers/upload: read the body in 1 MiB chunks, return its size."""
    return web.json_response({"size": await _count_body(request, 1 << 20)})


def make_app(max_body_size: int) -> web.Application:
    """Build the app; numpy is imported here so each worker process pays for it once."""
    work = _load_numpy_work()

    async def numpy_1ms(request: web.Request) -> web.Response:
        """Same as handlers/numpy_1ms: ~1 ms matmul inline, JSON in and out."""
        body = await request.json()
        return web.json_response({"result": work(float(body["scale"]))})

    app = web.Application(client_max_size=max_body_size)
    app.router.add_get("/health_check", health_check)
    app.router.add_post("/small_json", small_json)
    app.router.add_post("/binary", binary)
    app.router.add_post("/numpy_1ms", numpy_1ms)
    app.router.add_post("/upload", upload)
    return app


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket with SO_REUSEPORT so every worker can bind the same port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(1024)
    return sock


def serve(host: str, port: int, healthcheck_port: int | None, max_body_size: int) -> None:
    """Run one worker until SIGTERM/SIGINT."""
    socks = [_listen(host, port)]
    if healthcheck_port is not None and healthcheck_port != port:
        socks.append(_listen(host, healthcheck_port))
    web.run_app(make_app(max_body_size), sock=socks, access_log=None, print=None)


def _fork_worker(host: str, port: int, hc_port: int | None, max_body: int) -> int:
    """Fork an extra worker that dies with the parent, so a SIGKILLed parent leaves no orphans.

    Plain fork (not multiprocessing) keeps the process tree to exactly N processes:
    no resource-tracker helper inflating the measured RSS.
    """
    parent = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    code = 0
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() == parent:  # else the parent died before prctl took effect
            serve(host, port, hc_port, max_body)
    except BaseException:
        code = 1
    finally:
        os._exit(code)


def _reap(pids: list[int], timeout: float) -> list[int]:
    """Wait up to ``timeout`` seconds for ``pids`` to exit; return the ones still running."""
    deadline = time.monotonic() + timeout
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        for pid in list(alive):
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == 0:
                    continue
            alive.remove(pid)
        if alive:
            time.sleep(0.05)
    return alive


def main(argv: list[str] | None = None) -> None:
    """Parse the runtime-compatible port flags and start N worker processes."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--healthcheck-port", type=int, default=None)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--max-body-size", type=int, default=100 * 1024 * 1024)
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    args = parser.parse_args(argv)
    if args.loop == "uvloop":  # before any loop exists, in this process and the forked ones
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    if args.workers < 1:
        parser.error("--workers must be >= 1")

    serve_args = (args.host, args.port, args.healthcheck_port, args.max_body_size)
    children: list[int] = []
    try:
        for _ in range(args.workers - 1):
            children.append(_fork_worker(*serve_args))
        serve(*serve_args)
    finally:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        for pid in _reap(children, timeout=5):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _reap(children, timeout=5)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
