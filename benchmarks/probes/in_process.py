"""Probe: the handler in the front's own process, the design that would close the pinned gap.

Pinned to one core, the runtime's two processes (the front and its worker) share what the bare
app has alone, and each request pays the hop between them: a frame written and read on each
side, and each process woken for it. This probe serves the benchmark's small JSON handler the
way a one-worker runtime would with the handler in the front: aiohttp's public request handling
(slower than the front's direct path), the body read whole, the ABEJA request built by the
worker's own code (``decode_request``), the handler invoked by the worker's ``Invoker`` (its
context copy, its answer encoded by the contract), the answer written; no second process, no
frames. ``--on thread``: a ``def`` handler on one thread of its own, as such a design would run
it to keep the loop free (its cost: a hand-over to the thread and back per call);
``--on loop``: inline on the loop, the bound.

    cd benchmarks/handlers/small_json && PYTHONPATH=../../.. \
        taskset -c 0 python -m benchmarks.probes.in_process --port 18300 --on thread

then ``wrk`` on the other core, beside the bare app on uvloop (``benchmarks/bare_app.py``) and
the runtime in the same run: ``python -m benchmarks.probes.in_process --compare`` does it all.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import io
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from aiohttp import web

from benchmarks.load import run_wrk, wrk_script
from benchmarks.processes import tree_snapshot
from benchmarks.servers import ServerError, post

BENCH = Path(__file__).resolve().parent.parent
SMALL_JSON = BENCH / "handlers" / "small_json"
SMALL_BODY = b'{"total_without_tax": 100}'


async def _serve(port: int, on: str) -> None:
    from abeja_runtime.config import Config
    from abeja_runtime.encode import EncodedResponse
    from abeja_runtime.worker.decode import decode_request
    from abeja_runtime.worker.invoke import Invoker
    from abeja_runtime.worker.loader import load_handler

    config = Config(handler="main:handler")
    invoker = Invoker(config, load_handler(config))  # from the working directory
    thread = concurrent.futures.ThreadPoolExecutor(1)
    loop = asyncio.get_running_loop()

    def invoke(
        method: str, path: str, query: str, headers: list[tuple[str, str]], body: bytes
    ) -> EncodedResponse:
        request = decode_request(
            method=method,
            raw_path=path,
            raw_query=query,
            headers=headers,
            body=io.BytesIO(body),
            limits=invoker.limits,
        )
        coroutine = invoker.answer([request])
        try:
            coroutine.send(None)
        except StopIteration as done:
            replies: list[EncodedResponse] = done.value
            return replies[0]
        raise RuntimeError("the probe's handler is a def handler")

    async def handle(request: web.BaseRequest) -> web.Response:
        body = await request.read()
        args = (
            request.method,
            request.raw_path,
            request.query_string,
            list(request.headers.items()),
            body,
        )
        if on == "thread":
            reply = await loop.run_in_executor(thread, invoke, *args)
        else:
            reply = invoke(*args)
        return web.Response(status=reply.status, headers=reply.headers, body=reply.body)

    server = web.Server(handle, access_log=None)
    await loop.create_server(server, "127.0.0.1", port)
    await asyncio.Event().wait()


def _compare(rounds: int, seconds: int) -> None:
    """Each server pinned to CPU 0 in turn, wrk on CPU 1, ``rounds`` times interleaved."""
    from abeja_runtime.launch import free_ports

    py = sys.executable
    # The children run in the handler's folder: they import this repository from the path.
    pythonpath = os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(BENCH.parent)]))
    servers = {
        "bare-uvloop": ([py, str(BENCH / "bare_app.py"), "--loop", "uvloop"], "/small_json"),
        "runtime": ([py, "-m", "abeja_runtime", "--workers", "1"], "/"),
        "in-process, thread": ([py, "-m", "benchmarks.probes.in_process", "--on", "thread"], "/"),
        "in-process, loop": ([py, "-m", "benchmarks.probes.in_process", "--on", "loop"], "/"),
    }
    rates: dict[str, list[float]] = {name: [] for name in servers}
    peaks: dict[str, list[float]] = {name: [] for name in servers}
    tmp = tempfile.TemporaryDirectory(prefix="abeja-probe-")
    script = wrk_script(Path(tmp.name), "small_json", "application/json", SMALL_BODY)

    def wrk(port: int, path: str, seconds: float) -> float:
        url = f"http://127.0.0.1:{port}{path}"
        return run_wrk(url, script, duration=seconds, threads=1, connections=16, cpu="1").rps

    try:
        for _, (name, (command, path)) in itertools.product(range(rounds), servers.items()):
            port, health = free_ports(2)
            args = ["--port", str(port)]
            if name in ("bare-uvloop", "runtime"):
                args += ["--host", "127.0.0.1", "--healthcheck-port", str(health)]
            proc = subprocess.Popen(
                ["taskset", "-c", "0", *command, *args],
                cwd=SMALL_JSON,  # where the handler is (the repository's copy is not imported)
                env={**os.environ, "PYTHONPATH": pythonpath},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                _wait_ready(port, path)
                wrk(port, path, 2)
                rates[name].append(wrk(port, path, seconds))
                tree, _ = tree_snapshot(proc.pid, peak=True)  # (taskset runs the server as itself)
                peaks[name].append(sum(tree.values()) / 1024)
            finally:
                proc.terminate()
                proc.wait(30)
    finally:
        tmp.cleanup()
    bare = statistics.median(rates["bare-uvloop"])
    bare_peak = statistics.median(peaks["bare-uvloop"])
    print("| server | req/s (median) | runs | x bare on uvloop | peak RSS MiB | x bare |")
    print("|---|---:|---|---:|---:|---:|")
    for name, got in rates.items():
        runs = ", ".join(f"{r:,.0f}" for r in got)
        median, peak = statistics.median(got), statistics.median(peaks[name])
        print(
            f"| {name} | {median:,.0f} | {runs} | {median / bare:.2f} | {peak:.1f} "
            f"| {peak / bare_peak:.2f} |"
        )


def _wait_ready(port: int, path: str) -> None:
    """Until the server answers the small JSON request (a minute at most)."""
    for _ in range(600):
        with contextlib.suppress(OSError, ServerError):
            post(port, path, "application/json", SMALL_BODY, timeout=5)
            return
        time.sleep(0.1)
    raise RuntimeError(f"nothing answers on port {port}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=18300)
    p.add_argument("--on", choices=("thread", "loop"), default="thread")
    p.add_argument("--compare", action="store_true")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=int, default=10)
    args = p.parse_args()
    if args.compare:
        _compare(args.rounds, args.seconds)
        return
    import uvloop

    uvloop.run(_serve(args.port, args.on))


if __name__ == "__main__":
    main()
