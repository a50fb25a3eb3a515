"""Probe: would a cheaper refusal meet issue 41's noisy-neighbour target?

    python -m benchmarks.probes.cheap_refusal [--runs 3] [--seconds 20]

The noisy scenario of ``benchmarks.fairness`` floods at 10x the capacity, and the front spends
about 200 µs refusing each call past its tenant's share, on the core the worker shares. Here the
same flood goes to a stand-in on that core that refuses every request as cheaply as aiohttp's
low-level server can (``503`` from the parsed head, no call built), while tenant B's calls go
to the runtime as in the benchmark: B's p99 then shows what a refusal of that cost would leave.
Nothing is asserted; the runs are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import aiohttp

from abeja_runtime.launch import free_ports, wait_healthy
from benchmarks.fairness import (
    CAPACITY,
    FLOOD_CONNECTIONS,
    Flood,
    Runtime,
    Sent,
    _session_run,
    open_loop,
    p99,
)

_BUSY = b'{"status": "service busy"}'


def stand_in(port: int) -> None:
    """Refuse every request ``503`` (``/health_check``: ``200``), on uvloop."""
    import uvloop
    from aiohttp import web

    async def handler(request: web.BaseRequest) -> web.Response:
        if request.path == "/health_check":
            return web.Response(text="ok")
        await request.read()
        headers = {"Retry-After": "1", "Content-Type": "application/json"}
        return web.Response(status=503, body=_BUSY, headers=headers)

    async def serve() -> None:
        runner = web.ServerRunner(web.Server(handler))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()

    uvloop.run(serve())


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.probes.cheap_refusal")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--server-cores", default="1")
    parser.add_argument("--client-cores", default="0")
    parser.add_argument("--stand-in", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stand_in:
        stand_in(args.stand_in)
        return
    with (
        tempfile.TemporaryDirectory(prefix="abeja-cheap-refusal-") as tmp,
        runtime_and_stand_in(args.server_cores, Path(tmp)) as (runtime, port),
    ):
        for run in range(args.runs):
            print(_run(args, runtime.port, port, Path(tmp), run), flush=True)


@contextlib.contextmanager
def runtime_and_stand_in(cores: str, tmp: Path) -> Iterator[tuple[Runtime, int]]:
    """The runtime (with ``--tenant-header x-tenant``, as fairness's noisy scenario) and the
    stand-in, each pinned to ``cores``, started and then stopped: the runtime and the stand-in's
    port."""
    runtime = Runtime(["--tenant-header", "x-tenant", "--tenant-weights", "a=1,b=1"], cores, tmp)
    try:
        (port,) = free_ports(1)
        command = [sys.executable, "-m", "benchmarks.probes.cheap_refusal", "--stand-in", str(port)]
        refuser = subprocess.Popen(["taskset", "-c", cores, *command])
        try:
            wait_healthy("127.0.0.1", port, timeout=30, exit_code=refuser.poll)
            yield runtime, port
        finally:
            refuser.terminate()
            refuser.wait(10)
    finally:
        runtime.stop()


def _run(
    args: argparse.Namespace, runtime_port: int, refuser_port: int, tmp: Path, run: int
) -> str:
    alone, mixed = Sent(), Sent()
    flood = Flood("x-tenant: a", FLOOD_CONNECTIONS, rate=CAPACITY * 10)
    url = f"http://127.0.0.1:{runtime_port}/"

    def b_headers() -> dict[str, str]:
        return {"x-tenant": "b"}

    async def scenario(session: aiohttp.ClientSession) -> None:
        await open_loop(session, url, CAPACITY * 0.1, args.seconds, b_headers, alone)
        flooding = asyncio.to_thread(
            flood.run, f"http://127.0.0.1:{refuser_port}/", args.seconds, args.client_cores, tmp
        )
        b_calls = open_loop(session, url, CAPACITY * 0.1, args.seconds, b_headers, mixed)
        await asyncio.gather(flooding, b_calls)

    asyncio.run(_session_run(scenario))
    return (
        f"run {run + 1}: B's p99 alone {p99(alone.latencies) * 1000:.1f} ms; with the 10x flood "
        f"refused by the stand-in on the same core {p99(mixed.latencies) * 1000:.1f} ms "
        f"(B's success {mixed.statuses.get(200, 0)}/{mixed.total}; the flood sent "
        f"{flood.requests / args.seconds:.0f} requests/s)"
    )


if __name__ == "__main__":
    main()
