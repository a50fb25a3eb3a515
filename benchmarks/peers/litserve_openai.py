"""LitServe's ``OpenAISpec`` serving the toy chat model of ``handlers/chat/main.py``.

    python benchmarks/peers/litserve_openai.py PORT [--enable-async] [--no-fast-queue]
        [--api-servers 1] [--workers-per-device 1]

Run with a Python that has litserve (``/work/venvs/litserve/bin/python``), not the runtime's.
``POST /v1/chat/completions`` (with ``"stream": true``) streams ``pieces()``, the very generator
the runtime serves; ``GET /health`` says 200 once the inference worker is ready. SIGTERM stops
it as Ctrl-C does.

Its configuration, chosen from LitServe 0.2.19's source (``litserve/server.py``,
``loops/streaming_loops.py``, ``specs/openai.py``) for many short streams on one core:

* ``fast_queue=True``: the answers' pieces go from the inference worker to the API server over
  ZeroMQ instead of a ``multiprocessing.Manager`` queue, where each piece is a round trip
  through the manager's process and each read a hop to a thread (``asyncio.to_thread``).
  The requests still go through a manager queue: LitServe has no other way.
* ``predict`` a plain generator (``enable_async=False``, the default): the streaming loop takes
  the requests from their queue one after the other and runs each generator to its end, which
  for a generator that never waits is all there is to do; ``enable_async=True`` instead fetches
  each request with ``run_in_executor`` (a thread hop per request) and runs each generator in a
  task of a plain asyncio loop. ``--enable-async`` serves the same pieces from an async
  generator, to compare.
* one inference worker (``workers_per_device=1``) and one API server (``num_api_servers``, by
  default as many as workers): the benchmark pins all of LitServe's processes to the same
  core(s) as the runtime's one worker, and more processes on one core only take turns.
* no batching (``max_batch_size=1``): LitServe cannot batch an async ``predict``, a batched
  streaming loop polls its queue without blocking (a busy loop when ``batch_timeout=0``), and a
  batch would change the generator each stream is served by.
* uvicorn on uvloop and httptools (``loop="uvloop"``, ``http="httptools"``, which LitServe
  passes through ``run(**kwargs)``; uvicorn's "auto" picks the same, named here so that a venv
  without them fails instead of running slower), no access log, ``log_level="warning"`` like
  the runtime's.
* ``timeout=30`` (LitServe's default; only a queue wait longer than that would fail a stream),
  no ``track_requests`` (a lock per request), no client file.

Checked with ``python -m benchmarks.openai_streams --targets litserve --duration 4 --repeat 1
--litserve-args=...`` (2026-11-28, short single runs, some beside a test suite on the same
cores, so only a coarse ranking): this configuration 97, 135, 101 and 116 streams/s (47 beside
the suite); ``--enable-async`` 121 and 67 (64 and 26 beside it); ``--no-fast-queue`` 93; two API
servers 71; two inference workers 120. None did better.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "handlers" / "chat"))

import litserve as ls
from main import pace, pieces


class ToyChat(ls.LitAPI):  # type: ignore[misc]
    """The toy model as LitServe wants it: ``predict`` a generator of text pieces."""

    def predict(self, request: Any) -> Iterator[str]:
        seconds = pace(request.metadata)
        for index, piece in enumerate(pieces()):
            if index and seconds:
                time.sleep(seconds)
            yield piece


class AsyncToyChat(ls.LitAPI):  # type: ignore[misc]
    """The same with ``enable_async=True``: ``predict`` an async generator."""

    async def predict(self, request: Any) -> AsyncIterator[str]:
        seconds = pace(request.metadata)
        for index, piece in enumerate(pieces()):
            if index and seconds:
                await asyncio.sleep(seconds)
            yield piece


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("port", type=int)
    parser.add_argument("--enable-async", action="store_true", help="predict an async generator")
    parser.add_argument(
        "--no-fast-queue", action="store_true", help="Manager queues instead of ZeroMQ"
    )
    parser.add_argument("--api-servers", type=int, default=1, help="uvicorn processes")
    parser.add_argument("--workers-per-device", type=int, default=1, help="inference workers")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # LitServe stops its workers on KeyboardInterrupt; SIGTERM alone would orphan them.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    if args.enable_async:
        api: ls.LitAPI = AsyncToyChat(spec=ls.OpenAISpec(), enable_async=True)
    else:
        api = ToyChat(spec=ls.OpenAISpec())
    server = ls.LitServer(
        api,
        accelerator="cpu",
        workers_per_device=args.workers_per_device,
        fast_queue=not args.no_fast_queue,
    )
    server.run(
        host="127.0.0.1",
        port=args.port,
        num_api_servers=args.api_servers,
        log_level="warning",
        generate_client_file=False,
        loop="uvloop",
        http="httptools",
        access_log=False,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
