"""OpenAI-compatible streaming, measured: the runtime's ``--style openai`` against LitServe's
``OpenAISpec``, both serving the same toy chat generator on the same core(s), in the same run.

    python -m benchmarks.openai_streams [--streams 64] [--duration 10] [--warmup 2] [--repeat 3]
        [--firsts 200] [--server-cores 1] [--client-cores 0] [--targets runtime,litserve]

The generator (``handlers/chat/main.py``) yields 16 short text pieces with no sleep; its first
piece carries its own timestamps, ``"t0=... t1=... "`` (``time.time()`` when its body starts
and just before its first yield). Targets, alternated within each repetition (so that drift
hits both alike), each a fresh server in a session of its own on 127.0.0.1, pinned to
``--server-cores`` with taskset while this client runs on ``--client-cores``:

* ``runtime``: ``HANDLER=main python -m abeja_runtime --style openai`` in that folder, 1 worker,
  uvloop (``--loop uvloop``), ``--concurrency`` and ``--max-queue`` four times ``--streams``
  (every stream admitted at once, also in the open loop), ``--log-level warning`` (no access
  log line per stream); this checkout first on its ``PYTHONPATH``; ``--runtime-args`` adds
  flags;
* ``bare``: ``peers/bare_openai.py``, the same generator in one plain aiohttp process on uvloop
  (no validation, no admission, no second process): the floor, what no server undercuts on the
  same core;
* ``litserve``: ``peers/litserve_openai.py`` with ``--litserve-python`` (a venv of its own:
  ``python -m venv /work/venvs/litserve && /work/venvs/litserve/bin/pip install litserve``);
  its configuration, and why, is in that file's docstring; ``--litserve-args`` adds flags.
  Without that Python the target is skipped, with the reason.

Per repetition and target: start, wait for the health check (bounded: ``--ready-timeout``),
check one stream's answer, then with one client of keep-alive connections timed at the socket
(``socket_client.py``, on uvloop when it is installed), every request ``POST
/v1/chat/completions`` with ``"stream": true`` and each stream read to ``data: [DONE]`` (its 16
pieces checked), bounded by ``--stream-timeout``:

1. ``--warmup`` seconds of the load below, not recorded;
2. ``--duration`` seconds of ``--streams`` concurrent streams on keep-alive connections, each
   connection starting its next stream when one ends: completed streams per second (streams
   started in the window, over the time until the last of them ended), the added time to
   first token of each (below), the server's CPU (its process group, from /proc) and this
   client's, as shares of one core;
3. ``--firsts`` streams one at a time: the added time to first token with no queue;
4. ``--duration`` seconds of ``--streams`` concurrent streams of pieces ``--pace`` s apart, each
   connection starting its next stream as one ends (closed loop), all begun at once: the
   pieces of streams that began together go out together, and a stream begins as others end,
   in such a burst of ``--streams`` starts (the median waits behind half of them: no server
   on one core starts them all within 1 ms, the bare app included);
5. the same, each connection's first stream begun at its step of ``--streams`` even steps over
   a stream's length (``(PIECES - 1) * --pace``): the same concurrency, the starts spread
   as users who did not all press enter at once;
6. ``--warmup`` then ``--duration`` seconds (only those recorded: the connections are open by
   then) of the same paced streams arriving open-loop (Poisson, each on a connection of its own
   kept alive), at the rate that keeps ``--streams`` of them running on average (``--streams``
   over a stream's ``(PIECES - 1) * --pace`` seconds), as independent users would start them:
   their mean number in flight is reported;
7. stop: SIGTERM, a bounded wait (``--stop-timeout``), then SIGKILL to whatever of the server's
   process group or session is left (reported). Ctrl-C or SIGTERM stops the server first.

Added time to first token, per stream: (the read from the socket that completed the first content
piece less the write of the request to it) less the generator's own ``t1 - t0``, all ``time.time()``
on this machine: what the server adds, without the client's own building of the request and parsing
of the answer (both after the stamps). Each figure is the median of the ``--repeat`` runs, with
every run's figure in brackets. Verdicts: the runtime's streams/s at least ``3x`` LitServe's; the
runtime's added time to first token p50 at ``--streams`` concurrent paced streams at most 1 ms,
closed loop with its starts spread (5.) and open loop (6.), each beside the bare app's in the same
run (the closed loop begun in phase, 4., is reported beside the bare app's, not judged). Nothing is
asserted; the report is printed (and appended to RESULTS.md with ``--write``); exit status 1
when a target that was not skipped could not be measured in any run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import random
import re
import resource
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Protocol, TypeVar

from abeja_runtime.launch import free_port, free_ports, runtime_command
from benchmarks.batching import Peer
from benchmarks.processes import PAGE_TICKS, proc_table
from benchmarks.report import machine_info, write_results
from benchmarks.servers import REPO, SERVER_ENV, Server, ServerError
from benchmarks.socket_client import SocketClient

HERE = Path(__file__).resolve().parent
HANDLER_DIR = HERE / "handlers" / "chat"
PEER = HERE / "peers" / "litserve_openai.py"
BARE = HERE / "peers" / "bare_openai.py"
DEFAULT_LITSERVE_PYTHON = Path("/work/venvs/litserve/bin/python")
#: ``litserve-async``: the same peer with ``--enable-async`` (its ``predict`` an async
#: generator), LitServe's way to interleave streams that wait.
TARGETS = ("runtime", "bare", "litserve", "litserve-async")
LITSERVE_TARGETS = ("litserve", "litserve-async")
PATH = "/v1/chat/completions"
#: The model's name: the runtime serves it as ``--served-model-name``, LitServe takes any.
MODEL = "toy"


#: No ``max_tokens``: the runtime would count the pieces' words against it and cut the answer.
def body(pace: float = 0.0) -> bytes:
    """The request: the generator's pieces ``pace`` seconds apart (0: at once)."""
    request = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say sixteen words."}],
        "stream": True,
    }
    if pace:
        request["metadata"] = {"pace": repr(pace)}
    return json.dumps(request).encode()


BODY = body()


def _handler_pieces() -> list[str]:
    """One answer of the generator (``handlers/chat/main.py``'s ``pieces()``), run here."""
    spec = importlib.util.spec_from_file_location("chat_model", HANDLER_DIR / "main.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.pieces())


#: Pieces of one answer, the timestamp piece first, and the text of the others.
PIECES = len(_handler_pieces())
TAIL = "".join(_handler_pieces()[1:])
STAMPS = re.compile(r"^t0=([0-9.e+-]+) t1=([0-9.e+-]+) $")
#: The verdicts' bounds.
MIN_STREAMS_RATIO = 3.0
MAX_ADDED_TTFT_P50_MS = 1.0
#: How many times ``--streams`` the runtime runs at once, and queues.
ADMITTED = 4
#: The runtime's flags beyond ports and pinning (``--concurrency``/``--max-queue`` added).
RUNTIME_ARGS = (
    "--style", "openai", "--served-model-name", MODEL, "--workers", "1", "--loop", "uvloop",
    "--log-level", "warning",
)  # fmt: skip

T = TypeVar("T")


class StreamError(Exception):
    """A stream that was answered wrongly."""


# -- the client -------------------------------------------------------------------------------


def _content(line: bytes) -> str | None:
    """The content of one SSE line's chunk (``""`` when it has none); None for ``[DONE]``.

    :class:`StreamError` for a line that is no chunk (an error event, say)."""
    payload = line[5:].strip()
    if payload == b"[DONE]":
        return None
    try:
        delta = json.loads(payload)["choices"][0]["delta"] or {}
        return str(delta.get("content") or "")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        raise StreamError(f"not a chat completion chunk: {line[:200]!r}") from exc


def _generator_seconds(piece: str) -> float:
    """``t1 - t0`` of the generator's first piece."""
    found = STAMPS.match(piece)
    if found is None:
        raise StreamError(f"the first piece carries no timestamps: {piece[:200]!r}")
    return float(found.group(2)) - float(found.group(1))


def _is_piece(line: bytes) -> bool:
    """Whether an SSE line is a chunk with content (the first such is timed)."""
    if not line.startswith(b"data:"):
        return False
    try:
        return bool(_content(line))
    except StreamError:  # an error event: the whole answer's check says so
        return False


def _split_at_first_piece(body: bytes) -> tuple[str, bytes]:
    """The first piece's content, and the body after its line."""
    lines = body.split(b"\n")
    for at, line in enumerate(lines):
        if line.startswith(b"data:"):
            text = _content(line)
            if text is None:
                raise StreamError("data: [DONE] before any content")
            if text:
                return text, b"\n".join(lines[at + 1 :])
    raise StreamError("the stream ended before any content")


def _check_rest(rest: bytes) -> None:
    """The chunks after the first piece: the other pieces, in order, then ``data: [DONE]``."""
    texts: list[str] = []
    done = False
    for line in rest.splitlines():
        if not line.startswith(b"data:"):
            continue
        if done:
            raise StreamError(f"a chunk after data: [DONE]: {line[:200]!r}")
        text = _content(line)
        if text is None:
            done = True
        elif text:
            texts.append(text)
    if not done:
        raise StreamError("the stream ended without data: [DONE]")
    if "".join(texts) != TAIL:
        raise StreamError(f"expected {PIECES - 1} pieces after the first, got {texts!r}")


async def one_stream(client: SocketClient, timeout: float, data: bytes = BODY) -> float:
    """One streamed chat completion read to its end; its added time to first token (s)."""
    request = client.post(
        PATH, data, {"Content-Type": "application/json", "Accept": "text/event-stream"}
    )
    async with asyncio.timeout(timeout):
        answer = await client.exchange(request, _is_piece)
    if answer.status != 200:
        raise StreamError(f"HTTP {answer.status}: {answer.body[:200]!r}")
    first, rest = _split_at_first_piece(answer.body)
    _check_rest(rest)
    return (answer.arrived - answer.sent) - _generator_seconds(first)


#: What a failed stream may raise: a wrong answer, the connection's errors, a timeout.
STREAM_ERRORS = (StreamError, asyncio.TimeoutError, OSError)


@dataclass
class Tally:
    """The streams of one phase: each completed one's added time to first token, the failures."""

    added: list[float] = field(default_factory=list)
    failed: int = 0
    first_error: str = ""
    seconds: float = 0.0

    async def run(self, client: SocketClient, timeout: float, data: bytes = BODY) -> None:
        try:
            self.added.append(await one_stream(client, timeout, data))
        except STREAM_ERRORS as exc:
            self.failed += 1
            self.first_error = self.first_error or f"{type(exc).__name__}: {exc}"
            await asyncio.sleep(0.01)  # a server that refuses at once is not asked in a loop


async def load(
    client: SocketClient,
    streams: int,
    seconds: float,
    timeout: float,
    data: bytes = BODY,
    stagger: float = 0.0,
) -> Tally:
    """``streams`` connections, each starting its next stream as one ends, for ``seconds``;
    with ``stagger``, the connections' first streams begun at even steps over that many
    seconds (else all at once)."""
    tally = Tally()
    started = time.monotonic()
    deadline = started + seconds

    async def connection(turn: int) -> None:
        if stagger:
            await asyncio.sleep(stagger * turn / streams)
        while time.monotonic() < deadline:
            await tally.run(client, timeout, data)

    async with asyncio.timeout(seconds + stagger + timeout + 5):
        await asyncio.gather(*(connection(turn) for turn in range(streams)))
    tally.seconds = time.monotonic() - started
    return tally


async def open_loop(
    client: SocketClient,
    rate: float,
    seconds: float,
    timeout: float,
    data: bytes,
    warmup: float = 0.0,
) -> tuple[Tally, float]:
    """Streams begun at Poisson times, ``rate`` a second, for ``warmup`` seconds not recorded
    (their connections opened) then ``seconds``, each read to its end; and the mean number of
    the others in flight, seen at each recorded start."""
    tally, unrecorded = Tally(), Tally()
    running: set[asyncio.Task[None]] = set()
    in_flight = begun = 0
    draw = random.Random(0)
    started = time.monotonic()
    recorded = started + warmup
    due = started
    while due < recorded + seconds:
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        counted = due >= recorded
        if counted:
            in_flight += len(running)
            begun += 1
        teller = tally if counted else unrecorded
        task = asyncio.create_task(teller.run(client, timeout, data))
        running.add(task)
        task.add_done_callback(running.discard)
        due += draw.expovariate(rate)
    async with asyncio.timeout(timeout + 5):
        await asyncio.gather(*running)
    tally.seconds = time.monotonic() - recorded
    return tally, in_flight / max(1, begun)


async def one_at_a_time(client: SocketClient, count: int, timeout: float) -> Tally:
    """``count`` streams one after the other on one connection."""
    tally = Tally()
    for _ in range(count):
        await tally.run(client, timeout)
    return tally


# -- measuring --------------------------------------------------------------------------------


@dataclass
class Run:
    """One target's measurement in one repetition, or why there is none."""

    target: str
    streams_per_s: float = 0.0
    completed: int = 0
    failed: int = 0
    load_p50_ms: float = 0.0
    load_p99_ms: float = 0.0
    idle_p50_ms: float = 0.0
    idle_p99_ms: float = 0.0
    paced_p50_ms: float = 0.0
    paced_p99_ms: float = 0.0
    paced_cpu: float = 0.0
    staggered_p50_ms: float = 0.0
    staggered_p99_ms: float = 0.0
    open_p50_ms: float = 0.0
    open_p99_ms: float = 0.0
    open_in_flight: float = 0.0
    server_cpu: float = 0.0  # share of one core
    client_cpu: float = 0.0
    note: str = ""
    error: str = ""
    skipped: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and not self.skipped


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank); NaN when there are none."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else float("nan")


def _group_ticks(pgid: int) -> int:
    """CPU ticks used so far by the live processes of process group ``pgid``."""
    return sum(info.cpu_ticks for info in proc_table().values() if info.pgrp == pgid)


def _own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _measured(client: SocketClient, pgid: int, args: argparse.Namespace, run: Run) -> None:
    """The recorded load and the streams one at a time, into ``run``."""
    ticks, own = _group_ticks(pgid), _own_cpu_seconds()
    tally = await load(client, args.streams, args.duration, args.stream_timeout)
    run.server_cpu = (_group_ticks(pgid) - ticks) / PAGE_TICKS / tally.seconds
    run.client_cpu = (_own_cpu_seconds() - own) / tally.seconds
    run.completed, run.failed = len(tally.added), tally.failed
    run.streams_per_s = len(tally.added) / tally.seconds
    run.load_p50_ms = quantile(tally.added, 0.5) * 1000
    run.load_p99_ms = quantile(tally.added, 0.99) * 1000
    idle = await one_at_a_time(client, args.firsts, args.stream_timeout)
    run.failed += idle.failed
    run.idle_p50_ms = quantile(idle.added, 0.5) * 1000
    run.idle_p99_ms = quantile(idle.added, 0.99) * 1000
    ticks = _group_ticks(pgid)
    paced = await load(client, args.streams, args.duration, args.stream_timeout, body(args.pace))
    run.paced_cpu = (_group_ticks(pgid) - ticks) / PAGE_TICKS / paced.seconds
    run.failed += paced.failed
    run.paced_p50_ms = quantile(paced.added, 0.5) * 1000
    run.paced_p99_ms = quantile(paced.added, 0.99) * 1000
    staggered = await load(
        client, args.streams, args.duration, args.stream_timeout, body(args.pace),
        stagger=(PIECES - 1) * args.pace,
    )  # fmt: skip
    run.failed += staggered.failed
    run.staggered_p50_ms = quantile(staggered.added, 0.5) * 1000
    run.staggered_p99_ms = quantile(staggered.added, 0.99) * 1000
    rate = args.streams / ((PIECES - 1) * args.pace)
    opened, run.open_in_flight = await open_loop(
        client, rate, args.duration, args.stream_timeout, body(args.pace), args.warmup
    )
    run.failed += opened.failed
    run.open_p50_ms = quantile(opened.added, 0.5) * 1000
    run.open_p99_ms = quantile(opened.added, 0.99) * 1000
    phases = (tally, idle, paced, staggered, opened)
    errors = next((phase.first_error for phase in phases if phase.first_error), "")
    if errors:
        run.note = f"{run.failed} failed streams, the first: {errors}"
    if not all(phase.added for phase in phases):
        raise StreamError(f"no stream completed: {errors}")


async def _client(port: int, pgid: int, args: argparse.Namespace, run: Run) -> None:
    """Check one answer, warm up, then measure, on keep-alive connections timed at the socket."""
    client = SocketClient("127.0.0.1", port)
    try:
        await one_stream(client, args.stream_timeout)  # a wrong answer fails the run
        if args.warmup > 0:
            await load(client, args.streams, args.warmup, args.stream_timeout)
        await _measured(client, pgid, args, run)
    finally:
        client.close()


def _run_async(factory: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine on uvloop when it is installed (the client's own cost, kept low)."""

    async def main() -> T:
        return await factory()

    try:
        import uvloop
    except ImportError:
        return asyncio.run(main())
    return uvloop.run(main())


# -- the servers ------------------------------------------------------------------------------


class Serving(Protocol):
    """What :func:`serving` needs of a server: :class:`Server` and :class:`Peer` both have it."""

    port: int
    leftovers: list[int]

    def start(self) -> None: ...
    def wait_ready(self, timeout: float) -> float: ...
    def stop(self, timeout: float) -> None: ...


@contextlib.contextmanager
def serving(server: Serving, args: argparse.Namespace) -> Iterator[Serving]:
    """Start ``server`` and wait for its health check; stop it on every exit path."""
    try:
        server.start()
        server.wait_ready(args.ready_timeout)
        yield server
    finally:
        server.stop(args.stop_timeout)


def _clean_env() -> dict[str, str]:
    """This environment without the runtime's settings, plus the benchmarks' server settings."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("ABEJA_RUNTIME_") and key not in ("PORT", "HANDLER")
    }
    return {**env, **SERVER_ENV}


def runtime_flags(args: argparse.Namespace) -> list[str]:
    """The runtime's flags beyond its address: every stream admitted at once (the open loop's
    arrivals run above their mean at times: room for four times ``--streams``), then ours."""
    room = str(ADMITTED * args.streams)
    admitted = ["--concurrency", room, "--max-queue", room]
    return [*RUNTIME_ARGS, *admitted, *shlex.split(args.runtime_args)]


def runtime_server(args: argparse.Namespace, tmp: Path) -> Server:
    """The runtime serving ``handlers/chat`` (not started)."""
    port, health = free_ports(2)
    command = runtime_command(
        "--host", "127.0.0.1", "--port", str(port), "--healthcheck-port", str(health),
        *runtime_flags(args),
    )  # fmt: skip
    env = {**_clean_env(), "HANDLER": "main"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    log = tmp / f"runtime-{port}.log"
    pinned = ["taskset", "-c", args.server_cores, *command]
    return Server("runtime", pinned, HANDLER_DIR, env, log, port, health)


def litserve_flags(target: str, args: argparse.Namespace) -> list[str]:
    """The peer's flags for ``target``: ``--litserve-args``, and ``--enable-async`` for
    ``litserve-async``."""
    return [
        *(["--enable-async"] if target == "litserve-async" else []),
        *shlex.split(args.litserve_args),
    ]


def litserve_server(target: str, args: argparse.Namespace, tmp: Path) -> Peer:
    """LitServe's ``OpenAISpec`` serving the same generator (not started)."""
    port = free_port()
    env = _clean_env()
    env.pop("PYTHONPATH", None)  # the peer's venv, not this checkout
    command = [str(args.litserve_python), str(PEER), str(port), *litserve_flags(target, args)]
    cwd = tmp / f"litserve-{port}"
    cwd.mkdir()
    pinned = ["taskset", "-c", args.server_cores, *command]
    return Peer("litserve", pinned, env, cwd, tmp / f"litserve-{port}.log", port, "/health")


def bare_server(args: argparse.Namespace, tmp: Path) -> Peer:
    """The bare aiohttp app serving the same generator (not started)."""
    port = free_port()
    cwd = tmp / f"bare-{port}"
    cwd.mkdir()
    pinned = ["taskset", "-c", args.server_cores, sys.executable, str(BARE), str(port)]
    return Peer("bare", pinned, _clean_env(), cwd, tmp / f"bare-{port}.log", port, "/health")


def server_command(target: str, args: argparse.Namespace) -> str:
    """How ``target`` is started, for the report (ports and paths shortened)."""
    if target == "runtime":
        return shlex.join(["HANDLER=main", "python", "-m", "abeja_runtime", *runtime_flags(args)])
    if target == "bare":
        return "python benchmarks/peers/bare_openai.py PORT"
    extra = litserve_flags(target, args)
    return shlex.join(["python", "benchmarks/peers/litserve_openai.py", "PORT", *extra])


def measure(target: str, args: argparse.Namespace, tmp: Path) -> Run:
    """Start ``target``, measure it, stop it; a failure is a run with its reason."""
    run = Run(target)
    if target in LITSERVE_TARGETS and (
        args.litserve_python is None or not args.litserve_python.exists()
    ):
        python = args.litserve_python or DEFAULT_LITSERVE_PYTHON
        run.skipped = f"no Python: {python} does not exist (--litserve-python)"
        return run
    server: Server | Peer
    if target == "runtime":
        server = runtime_server(args, tmp)
    elif target == "bare":
        server = bare_server(args, tmp)
    else:
        server = litserve_server(target, args, tmp)
    try:
        with serving(server, args) as started:
            pgid = _pgid(server)
            _run_async(lambda: _client(started.port, pgid, args, run))
        if server.leftovers:
            run.error = f"left {len(server.leftovers)} process(es) after SIGTERM"
    except (ServerError, StreamError, OSError, asyncio.TimeoutError) as exc:
        run.error = _reason(exc)
        print(f"  ! {target}: {str(exc).strip()}", file=sys.stderr)
    return run


def _pgid(server: Server | Peer) -> int:
    """The server's process group: its launcher's pid (a session of its own)."""
    assert server.process is not None
    return server.process.pid


def _reason(exc: BaseException) -> str:
    """The first line of an error and, when it carries a log, the log's last line."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    text = lines[0] if len(lines) == 1 else f"{lines[0]} … {lines[-1]}"
    return text.replace("|", "/")[:300]


# -- the report -------------------------------------------------------------------------------


@dataclass
class Row:
    """A target's runs, summarised: each figure the median over the runs that succeeded."""

    target: str
    runs: list[Run]

    @property
    def ok_runs(self) -> list[Run]:
        return [run for run in self.runs if run.ok]

    def median(self, name: str) -> float:
        values = [getattr(run, name) for run in self.ok_runs]
        return statistics.median(values) if values else float("nan")

    def each(self, name: str, digits: int) -> str:
        return ", ".join(f"{getattr(run, name):.{digits}f}" for run in self.ok_runs)


def _cell(row: Row, name: str, digits: int) -> str:
    if not row.ok_runs:
        return "-"
    if len(row.ok_runs) == 1:
        return f"{row.median(name):.{digits}f}"
    return f"{row.median(name):.{digits}f} [{row.each(name, digits)}]"


def _note(row: Row) -> str:
    skipped = [run.skipped for run in row.runs if run.skipped]
    if skipped:
        return f"skipped: {skipped[0]}"
    failed = [run.error for run in row.runs if run.error]
    notes = [f"{len(failed)} of {len(row.runs)} runs FAILED: {failed[0]}"] if failed else []
    notes += [run.note for run in row.runs if run.note][:1]
    return "; ".join(notes)


def verdicts(rows: dict[str, Row], args: argparse.Namespace) -> list[str]:
    """The two targets, PASS or FAIL, each with its figures; no verdict without them."""
    runtime = rows.get("runtime")
    peers = [rows[name] for name in LITSERVE_TARGETS if name in rows and rows[name].ok_runs]
    lines: list[str] = []
    if runtime and runtime.ok_runs and peers:
        best = max(peers, key=lambda row: row.median("streams_per_s"))
        ratio = runtime.median("streams_per_s") / best.median("streams_per_s")
        verdict = "PASS" if ratio >= MIN_STREAMS_RATIO else "FAIL"
        lines.append(
            f"streams/s: runtime {ratio:.2f}x LitServe's best ({best.target}) (target: at least "
            f"{MIN_STREAMS_RATIO:g}x): {verdict}."
        )
    else:
        lines.append("streams/s: no verdict (a target was not run, skipped or failed every run).")
    bare = rows.get("bare")
    if runtime and runtime.ok_runs:  # reported, not judged (see the module)
        floor = (
            f", the bare app {bare.median('paced_p50_ms'):.3f} ms" if bare and bare.ok_runs else ""
        )
        lines.append(
            f"added time to first token p50, {args.streams} paced streams begun in phase (each "
            f"start waits behind up to {args.streams - 1} others'), not judged: runtime "
            f"{runtime.median('paced_p50_ms'):.3f} ms{floor}."
        )
    phases = (
        ("staggered_p50_ms", "closed loop, first streams staggered"),
        ("open_p50_ms", "open loop"),
    )
    for name, how in phases:
        if not (runtime and runtime.ok_runs):
            lines.append(
                f"added time to first token, {how}: no verdict (the runtime was not run or failed)."
            )
            continue
        p50 = runtime.median(name)
        verdict = "PASS" if p50 <= MAX_ADDED_TTFT_P50_MS else "FAIL"
        floor = (
            f"; the bare app {bare.median(name):.3f} ms in the same runs"
            if bare and bare.ok_runs
            else ""
        )
        lines.append(
            f"added time to first token p50, {args.streams} paced streams ({args.pace:g} s "
            f"between pieces), {how}: runtime {p50:.3f} ms (target: at most "
            f"{MAX_ADDED_TTFT_P50_MS:g} ms): {verdict}{floor}."
        )
    return lines


def render(
    rows: dict[str, Row], args: argparse.Namespace, command: str, machine: list[tuple[str, str]]
) -> str:
    """The report: how it was run (``machine``: taken at the start), the table, the verdicts."""
    lines = [
        f"OpenAI-compatible streams ({time.strftime('%Y-%m-%d')}; `{command}`): the toy chat "
        f"generator ({PIECES} pieces, no sleep); servers pinned to CPU {args.server_cores}, the "
        f"client to CPU {args.client_cores}; {args.streams} concurrent streams for "
        f"{args.duration:g} s after {args.warmup:g} s of warm-up, then {args.firsts} streams one "
        f"at a time, then {args.streams} concurrent streams of pieces {args.pace:g} s apart for "
        f"{args.duration:g} s (a model that takes time per token: the server is not saturated), "
        f"closed loop, begun in phase, then begun at even steps over a stream's length, then "
        f"the same streams arriving open-loop at {args.streams} in flight on "
        f"average for {args.duration:g} s; median of {args.repeat} runs, targets alternated, "
        "every run in brackets.",
        "",
        *[f"- {name}: {value}" for name, value in machine],
        f"- LitServe: {_peer_versions(args.litserve_python)}",
        *[f"- {target}: `{server_command(target, args)}`" for target in rows],
        "",
        "| target | streams/s | streams done (failed), all runs | added TTFT p50 ms, one at a "
        f"time | p99 ms | added TTFT p50 ms, {args.streams} streams | p99 ms | server CPU % | "
        f"client CPU % | added TTFT p50 ms, {args.streams} paced streams | p99 ms | server CPU "
        "%, paced | added TTFT p50 ms, paced, staggered | p99 ms | added TTFT p50 ms, open loop "
        "| p99 ms | streams in flight, open loop | note |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows.values():
        cells = [
            _cell(row, "streams_per_s", 0),
            f"{sum(run.completed for run in row.runs)} ({sum(run.failed for run in row.runs)})",
            _cell(row, "idle_p50_ms", 3),
            _cell(row, "idle_p99_ms", 3),
            _cell(row, "load_p50_ms", 1),
            _cell(row, "load_p99_ms", 1),
            f"{row.median('server_cpu') * 100:.0f}" if row.ok_runs else "-",
            f"{row.median('client_cpu') * 100:.0f}" if row.ok_runs else "-",
            _cell(row, "paced_p50_ms", 3),
            _cell(row, "paced_p99_ms", 3),
            f"{row.median('paced_cpu') * 100:.0f}" if row.ok_runs else "-",
            _cell(row, "staggered_p50_ms", 3),
            _cell(row, "staggered_p99_ms", 3),
            _cell(row, "open_p50_ms", 3),
            _cell(row, "open_p99_ms", 3),
            _cell(row, "open_in_flight", 0),
            _note(row),
        ]
        lines.append(f"| {row.target} | {' | '.join(cells)} |")
    lines += ["", *verdicts(rows, args)]
    return "\n".join(lines) + "\n"


def _peer_versions(python: Path | None) -> str:
    """litserve, fastapi, uvicorn, pyzmq and uvloop in the peer's venv."""
    if python is None or not python.exists():
        return "-"
    names = ("litserve", "fastapi", "uvicorn", "pyzmq", "uvloop")
    code = (
        "import importlib.metadata as m\n"
        f"for n in {names!r}:\n"
        "    try: print(n, m.version(n))\n"
        "    except m.PackageNotFoundError: print(n, '-')"
    )
    try:
        found = subprocess.run(
            [str(python), "-c", code], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    return ", ".join(found.stdout.split("\n")[: len(names)]) or "?"


# -- command ----------------------------------------------------------------------------------


def _cpus(text: str) -> set[int]:
    """A taskset CPU list (``0``, ``0,2``, ``0-3``) as a set."""
    cpus: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.openai_streams",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--streams", type=int, default=64, help="concurrent streams")
    parser.add_argument("--duration", type=float, default=10, help="seconds of recorded load")
    parser.add_argument("--warmup", type=float, default=2, help="unrecorded seconds first")
    parser.add_argument("--repeat", type=int, default=3, help="runs per target; the median")
    parser.add_argument("--firsts", type=int, default=200, help="streams one at a time")
    parser.add_argument(
        "--pace", type=float, default=0.02, help="seconds between pieces, in the paced phase"
    )
    parser.add_argument("--server-cores", default="1", help="taskset -c of both servers")
    parser.add_argument("--client-cores", default="0", help="CPUs of this client")
    parser.add_argument(
        "--targets",
        type=lambda text: [name for name in text.split(",") if name],
        default=list(TARGETS),
        help=f"comma-separated, of: {','.join(TARGETS)} (default: all)",
    )
    default_python = DEFAULT_LITSERVE_PYTHON if DEFAULT_LITSERVE_PYTHON.exists() else None
    parser.add_argument("--litserve-python", type=Path, default=default_python)
    parser.add_argument(
        "--runtime-args", default="", help="more flags for the runtime ('--runtime-args=--x 1')"
    )
    parser.add_argument(
        "--litserve-args", default="", help="more peer flags ('--litserve-args=--enable-async')"
    )
    parser.add_argument("--stream-timeout", type=float, default=30, help="seconds per stream")
    parser.add_argument("--ready-timeout", type=float, default=60, help="seconds to start")
    parser.add_argument("--stop-timeout", type=float, default=30, help="seconds to exit")
    parser.add_argument("--write", action="store_true", help="append the report to RESULTS.md")
    args = parser.parse_args(argv)
    if unknown := [name for name in args.targets if name not in TARGETS]:
        parser.error(f"unknown targets: {', '.join(unknown)}")
    if args.repeat < 1 or args.duration <= 0 or args.streams < 1 or args.firsts < 1:
        parser.error("--repeat, --streams and --firsts must be at least 1, --duration positive")
    try:
        _cpus(args.server_cores), _cpus(args.client_cores)
    except ValueError:
        parser.error("--server-cores and --client-cores are CPU lists such as 1 or 0-1")
    return args


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGTERM as Ctrl-C: during the client's phases asyncio's runner then cancels its task."""
    os.kill(os.getpid(), signal.SIGINT)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    given = sys.argv[1:] if argv is None else argv
    command = shlex.join(["python", "-m", "benchmarks.openai_streams", *given])
    signal.signal(signal.SIGTERM, _interrupt)  # stop the server on the way out, as on Ctrl-C
    machine = machine_info(f"working tree {REPO}")  # before this process is pinned
    os.sched_setaffinity(0, _cpus(args.client_cores))
    rows = {target: Row(target, []) for target in args.targets}
    with tempfile.TemporaryDirectory(prefix="abeja-openai-streams-") as tmp:
        try:
            for repetition in range(args.repeat):
                for target in args.targets:
                    print(f"{target} ({repetition + 1}/{args.repeat})", file=sys.stderr)
                    rows[target].runs.append(measure(target, args, Path(tmp)))
        except KeyboardInterrupt:
            print("interrupted: every server was stopped", file=sys.stderr)
            return 130
    report = render(rows, args, command, machine)
    print(report)
    if args.write:
        write_results(report, append=True)
    unmeasured = [row for row in rows.values() if not row.ok_runs and not row.runs[0].skipped]
    return 1 if unmeasured else 0


if __name__ == "__main__":
    sys.exit(main())
