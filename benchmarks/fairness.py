"""Fair and deadline-aware admission, measured on a handler that takes 5 ms (one worker, one
slot: 200 calls a second at most).

    python -m benchmarks.fairness [--seconds 10] [--repeat 3] [--deadline-requests 100000]
        [--server-cores 1] [--client-cores 0] [--write]

Scenarios, each against a fresh runtime pinned to ``--server-cores`` (the clients on
``--client-cores``):

* ``noisy``: tenant A floods at 10x what the worker serves (wrk, 800 connections each pausing
  a random time before its next request, :data:`FLOOD_CONNECTIONS`), tenant B sends 10 % of
  what the worker serves (both at random times), with
  ``--tenant-header x-tenant --tenant-weights a=1,b=1``; B's p99 latency and success against B
  alone (same rate, no A), and A's share of what was served (B takes what it asks, A the rest);
* ``backlogged``: A and B both flood (wrk, 32 connections each), weights ``a=3,b=1``: A's share
  of what is served, against its weight's (75 %);
* ``deadlines``: ``--deadline-requests`` requests at 1.5x what the worker serves, each with a
  random ``Request-Timeout`` from 5 ms to 100 ms and its absolute deadline in ``x-deadline-at``:
  the calls the handler started after their deadline as the runtime reckons it (its access
  record's arrival plus the budget; the target: none), the same by the client's clock (which
  starts the budget before the request is sent); the calls the runtime refused for their
  deadline (``503`` at once, or ``504`` past their latest start: their access records'
  ``refused``), and those of them the handler had started (the target: none); and the calls
  started in time that were still running at their deadline, answered ``504`` then (a timeout,
  as at ``--timeout``: a call that runs is not refused);
* ``priority``: ``low`` calls flooding (wrk) and ``high`` calls at 10 % of what it serves,
  ``--priority-header x-priority``: what a high call waits behind, against the target of one
  running call per worker (a call that runs is not interrupted). Counted: the ``low`` calls
  it waited behind, those still running when it reached the front (its access record) or
  started after, and begun before it (the handler logs each call's start and end); the target
  is one at most.
  Timed three ways: from its arrival at the front to its handler's start (the running call's
  rest, the hand-over, and the machine's pauses), from its send to its start (with the way
  there, from this client on a core it shares with wrk), and its latency less the handler's
  5 ms (with the answer's way back as well).

B's and the high calls' requests come from this Python client, open-loop (Poisson), on the
client core beside wrk. Each figure is the median of ``--repeat`` runs. Nothing is asserted;
the report is printed (and appended to RESULTS.md with ``--write``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Final

import aiohttp

from abeja_runtime.launch import RuntimeProcess, free_ports, runtime_command
from benchmarks.report import machine_info, write_results
from benchmarks.servers import REPO, SERVER_ENV

HERE = Path(__file__).resolve().parent
HANDLER_DIR = HERE / "handlers" / "fair_5ms"
#: The handler's own time per call, and so what one slot serves a second.
CALL_SECONDS = 0.005
CAPACITY = 1 / CALL_SECONDS
#: The noisy tenant's connections: enough that those refused at once send 10x the capacity
#: while up to the queue's places wait for their answers.
FLOOD_CONNECTIONS = 800


@dataclass
class Sent:
    """What one sender saw: each answered call's latency (s), and the statuses."""

    latencies: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    late_starts: int = 0
    #: How late the latest of them started (s).
    latest_start: float = 0.0
    #: The tags of the calls answered 503 or 504.
    refused: list[str] = field(default_factory=list)
    #: When each tagged call was sent (``time.time()``), by its tag.
    sent_at: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.statuses.values())

    def count(self, status: int) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1


async def _one(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str], sent: Sent
) -> None:
    if tag := headers.get("x-tag"):
        sent.sent_at[tag] = time.time()
    began = time.monotonic()
    try:
        async with session.post(url, data=b"{}", headers=headers) as response:
            body = await response.read()
            sent.count(response.status)
            if response.status == 200:
                sent.latencies.append(time.monotonic() - began)
                late_by = float(json.loads(body).get("late_by", 0.0))
                if late_by > 0:
                    sent.late_starts += 1
                    sent.latest_start = max(sent.latest_start, late_by)
            elif response.status in (503, 504):
                sent.refused.append(headers.get("x-tag", ""))
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        sent.count(0)


async def open_loop(
    session: aiohttp.ClientSession,
    url: str,
    rate: float,
    seconds: float,
    headers: Callable[[], dict[str, str]],
    sent: Sent,
) -> None:
    """Requests at ``rate`` a second for ``seconds``, each at its time (Poisson arrivals)."""
    tasks: set[asyncio.Task[None]] = set()
    end = time.monotonic() + seconds
    at = time.monotonic()
    while at < end:
        at += random.expovariate(rate)
        delay = at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(_one(session, url, headers(), sent))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(tasks, timeout=30)


#: wrk's script: every request a small JSON POST (the headers come with ``-H``).
_WRK_LUA: Final = """wrk.method = "POST"
wrk.body = "{}"
wrk.headers["Content-Type"] = "application/json"
"""


#: ... and, for a flood at a rate, each connection's pause before its next request: random,
#: ``SPAN`` ms at most (twice the mean), so that the connections send at random times.
_WRK_PACED_LUA: Final = """
function delay()
    return math.random(0, SPAN)
end
"""


@dataclass
class Flood:
    """A flood by wrk: ``connections`` at once, each sending its next request as its answer
    comes (a closed loop, far more than the worker serves, refused ``503`` beyond the queue);
    or, with ``rate``, each pausing a random time first, so that together they send about
    ``rate`` requests a second at random times (while most of their calls are refused at
    once: the connections are many more than the queue's places)."""

    header: str
    connections: int
    rate: float | None = None
    requests: int = 0
    refused: int = 0

    def run(self, url: str, seconds: float, cores: str, tmp: Path) -> None:
        script = tmp / f"flood-{id(self)}.lua"
        lua = _WRK_LUA
        if self.rate is not None:
            span = round(2000 * self.connections / self.rate)
            lua += _WRK_PACED_LUA.replace("SPAN", str(span))
        script.write_text(lua)
        command = [
            "taskset", "-c", cores, "wrk", "-t1", f"-c{self.connections}", f"-d{seconds:g}s",
            "--timeout", "30s", "-H", self.header, "-s", str(script), url,
        ]  # fmt: skip
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=seconds + 90, check=True
        )
        total = re.search(r"^\s*(\d+) requests in", done.stdout, re.M)
        refused = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", done.stdout)
        self.requests = int(total.group(1)) if total else 0
        self.refused = int(refused.group(1)) if refused else 0

    @property
    def served(self) -> int:
        return self.requests - self.refused


class Runtime:
    """The runtime serving the 5 ms handler, pinned, with ``flags``."""

    def __init__(self, flags: list[str], cores: str, tmp: Path, *, access: bool = False) -> None:
        """``access``: its access records kept (:attr:`records`), for the calls' arrivals."""
        self.port, health = free_ports(2)
        command = runtime_command(
            "--host", "127.0.0.1", "--port", str(self.port), "--healthcheck-port", str(health),
            "--workers", "1", "--concurrency", "1", "--max-queue", "64", "--log-level",
            "info" if access else "warning", *flags,
        )  # fmt: skip
        self.records: list[str] = []
        env = {k: v for k, v in os.environ.items() if not k.startswith("ABEJA_RUNTIME_")}
        env.update(SERVER_ENV)
        env.update({"HANDLER": "main:handler", "TMPDIR": str(tmp)})
        self.log = tmp / f"started-{self.port}.log"
        env["FAIR_LOG"] = str(self.log)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        self.flags = flags
        self.process = RuntimeProcess(
            ["taskset", "-c", cores, *command],
            cwd=HANDLER_DIR,
            env=env,
            on_line=self.records.append if access else None,
        )
        self.process.port, self.process.healthcheck_port = self.port, health
        self.process.wait_healthy(60)

    def calls(self) -> list[tuple[str, float, float]]:
        """Each call the handler ran: its tag (``-``: none), its start and its end
        (``time.time()``)."""
        if not self.log.exists():
            return []
        lines = (line.split() for line in self.log.read_text().splitlines())
        return [(tag, float(start), float(end)) for tag, start, end in lines]

    def started(self) -> dict[str, float]:
        """When the handler started each tagged call (``time.time()``), by its tag."""
        return {tag: start for tag, start, _ in self.calls() if tag != "-"}

    def arrivals(self) -> dict[str, float]:
        """When the front received each call (its access record's ``request_timestamp``), by
        the tag sent as its request id."""
        found = {}
        for line in self.records:
            if '"request_timestamp"' in line:
                record = json.loads(line)
                stamp = datetime.fromisoformat(record["request_timestamp"]).timestamp()
                found[record["request_id"]] = stamp
        return found

    def deadlines(self) -> tuple[dict[str, float], set[str]]:
        """Each call's deadline as the runtime reckons it (its access record's arrival plus the
        ``deadline`` it noted), by the tag sent as its request id; and the tags of the calls
        it refused for their deadline (their records' ``refused``)."""
        found, refused = {}, set()
        for line in self.records:
            if '"deadline"' not in line:
                continue
            record = json.loads(line)
            arrived = datetime.fromisoformat(record["request_timestamp"]).timestamp()
            found[record["request_id"]] = arrived + float(record["deadline"])
            if record.get("refused") == "deadline":
                refused.add(record["request_id"])
        return found, refused

    def stop(self) -> None:
        self.process.stop(30)
        reader = getattr(self.process, "reader", None)
        if reader is not None:  # what it wrote last, read
            reader.join(10)


def p50(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else float("nan")


async def _session_run(body: Callable[[aiohttp.ClientSession], object]) -> None:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        await body(session)  # type: ignore[misc]


def noisy(args: argparse.Namespace, tmp: Path) -> dict[str, float]:
    """B's p99 and success with A flooding (wrk), B alone, A's share of what was served."""
    flags = ["--tenant-header", "x-tenant", "--tenant-weights", "a=1,b=1"]
    alone, mixed_b = Sent(), Sent()
    flood = Flood("x-tenant: a", FLOOD_CONNECTIONS, rate=CAPACITY * 10)
    server = Runtime(flags, args.server_cores, tmp)
    url = f"http://127.0.0.1:{server.port}/"
    b_rate = CAPACITY * 0.1

    def b_headers() -> dict[str, str]:
        return {"x-tenant": "b"}

    try:

        async def scenario(session: aiohttp.ClientSession) -> None:
            await open_loop(session, url, b_rate, args.seconds, b_headers, alone)
            flooding = asyncio.to_thread(flood.run, url, args.seconds, args.client_cores, tmp)
            await asyncio.gather(
                flooding, open_loop(session, url, b_rate, args.seconds, b_headers, mixed_b)
            )

        asyncio.run(_session_run(scenario))
    finally:
        server.stop()
    served_b = mixed_b.statuses.get(200, 0)
    return {
        "b_alone_p99_ms": p99(alone.latencies) * 1000,
        "b_p99_ms": p99(mixed_b.latencies) * 1000,
        "b_success": served_b / max(1, mixed_b.total),
        "a_share": flood.served / max(1, flood.served + served_b),
        "a_sent_per_s": flood.requests / args.seconds,
    }


def backlogged(args: argparse.Namespace, tmp: Path) -> dict[str, float]:
    """A and B both flooding (wrk each), weights 3 and 1: A's share of what was served."""
    flags = ["--tenant-header", "x-tenant", "--tenant-weights", "a=3,b=1"]
    a, b = Flood("x-tenant: a", 32), Flood("x-tenant: b", 32)
    server = Runtime(flags, args.server_cores, tmp)
    url = f"http://127.0.0.1:{server.port}/"
    try:

        async def scenario() -> None:
            await asyncio.gather(
                asyncio.to_thread(a.run, url, args.seconds, args.client_cores, tmp),
                asyncio.to_thread(b.run, url, args.seconds, args.client_cores, tmp),
            )

        asyncio.run(scenario())
    finally:
        server.stop()
    return {"a_share": a.served / max(1, a.served + b.served), "served": a.served + b.served}


def deadlines(args: argparse.Namespace, tmp: Path) -> dict[str, float]:
    sent = Sent()
    server = Runtime([], args.server_cores, tmp, access=True)
    url = f"http://127.0.0.1:{server.port}/"
    rate = CAPACITY * 1.5
    seconds = args.deadline_requests / rate

    tags = iter(range(10**9))

    def headers() -> dict[str, str]:
        budget = random.uniform(0.005, 0.1)
        tag = f"t{next(tags)}"
        return {
            "Request-Timeout": f"{budget:.4f}",
            "x-deadline-at": repr(time.time() + budget),
            "x-tag": tag,
            "x-abeja-request-id": tag,
        }

    try:
        asyncio.run(_session_run(lambda s: open_loop(s, url, rate, seconds, headers, sent)))
        server.stop()  # its last access records written
        started, (reckoned, refused) = server.started(), server.deadlines()
    finally:
        server.stop()
    late = [started[tag] - reckoned[tag] for tag in started if tag in reckoned]
    return {
        "requests": sent.total,
        "answered": sent.statuses.get(200, 0),
        "refused_503": sent.statuses.get(503, 0),
        "timed_out_504": sent.statuses.get(504, 0),
        "started_after_the_runtimes_deadline": sum(seconds > 0 for seconds in late),
        "started_calls_checked": len(late),
        "started_late_by_the_clients_clock": sent.late_starts,
        "clients_clock_late_by_ms_at_most": sent.latest_start * 1000,
        "deadline_refusals_started": sum(tag in started for tag in refused),
        "deadline_refusals": len(refused),
        "cut_at_the_deadline_while_running": sum(
            tag in started and tag not in refused for tag in sent.refused
        ),
    }


def priority(args: argparse.Namespace, tmp: Path) -> dict[str, float]:
    """``low`` calls flooding (wrk), ``high`` ones at 10 % of what the worker serves: what a
    high call waits behind (the ``low`` calls running when it reached the front or started
    after, and begun before it: one at most, the running call), and
    its wait as time: from its arrival at the front to its handler's start (the access record
    and the handler's log), and as the client sees it (its latency less the handler's 5 ms)."""
    high = Sent()
    flood = Flood("x-priority: low", 64)
    server = Runtime(["--priority-header", "x-priority"], args.server_cores, tmp, access=True)
    url = f"http://127.0.0.1:{server.port}/"

    tags = iter(range(10**9))

    def high_headers() -> dict[str, str]:
        tag = f"h{next(tags)}"
        return {"x-priority": "high", "x-tag": tag, "x-abeja-request-id": tag}

    try:

        async def scenario(session: aiohttp.ClientSession) -> None:
            flooding = asyncio.to_thread(flood.run, url, args.seconds, args.client_cores, tmp)
            await asyncio.gather(
                flooding,
                open_loop(session, url, CAPACITY * 0.1, args.seconds, high_headers, high),
            )

        asyncio.run(_session_run(scenario))
        server.stop()  # its last starts and access records written
        calls, arrived = server.calls(), server.arrivals()
    finally:
        server.stop()
    started = {tag: start for tag, start, _ in calls if tag != "-"}
    low = [(start, end) for tag, start, end in calls if tag == "-"]
    measured = [(arrived[tag], start) for tag, start in started.items() if tag in arrived]
    # the low calls each high call waited behind: running when it reached the front, or
    # started after, and begun before it
    behind = [sum(end > at and begun < start for begun, end in low) for at, start in measured]
    front_waits = [start - at for at, start in measured]
    waits = [latency - CALL_SECONDS for latency in high.latencies]
    start_waits = [started[tag] - at for tag, at in high.sent_at.items() if tag in started]
    return {
        "high_calls_measured": len(measured),
        "high_behind_low_calls_max": max(behind, default=float("nan")),
        "high_behind_more_than_one": sum(count > 1 for count in behind),
        "high_front_wait_p50_ms": p50(front_waits) * 1000,
        "high_front_wait_p99_ms": p99(front_waits) * 1000,
        "high_wait_p50_ms": p50(waits) * 1000,
        "high_wait_p99_ms": p99(waits) * 1000,
        "high_start_wait_p50_ms": p50(start_waits) * 1000,
        "high_start_wait_p99_ms": p99(start_waits) * 1000,
        "high_success": high.statuses.get(200, 0) / max(1, high.total),
    }


SCENARIOS = {"noisy": noisy, "backlogged": backlogged, "deadlines": deadlines, "priority": priority}


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def render(results: dict[str, list[dict[str, float]]], command: str) -> str:
    lines = [
        f"Fairness ({time.strftime('%Y-%m-%d')}; `{command}`): a handler of 5 ms, one worker "
        f"and one slot ({CAPACITY:.0f} calls/s); floods by wrk (noisy: 10x the capacity at "
        "random times; backlogged and priority: closed loops), the measured callers open-loop "
        "(Poisson) from Python, both on the client core; median of the runs (every run in "
        "brackets).",
        "",
        *[f"- {name}: {value}" for name, value in machine_info("working tree")],
        "",
        "| scenario | figure | median | runs |",
        "|---|---|---:|---|",
    ]
    for name, runs in results.items():
        middle = median_of(runs)
        for key, value in middle.items():
            each = ", ".join(f"{run[key]:.3g}" for run in runs)
            lines.append(f"| {name} | {key} | {value:.3g} | [{each}] |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fairness", description=__doc__)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--deadline-requests", type=int, default=100_000)
    parser.add_argument("--server-cores", default="1")
    parser.add_argument("--client-cores", default="0")
    parser.add_argument("--only", default=",".join(SCENARIOS))
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args(argv)
    command = shlex.join(["python", "-m", "benchmarks.fairness", *(argv or sys.argv[1:])])
    os.sched_setaffinity(0, {int(cpu) for cpu in args.client_cores.split(",")})
    results: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="abeja-fairness-") as tmp:
        for name in args.only.split(","):
            for run in range(args.repeat):
                print(f"{name} ({run + 1}/{args.repeat})", file=sys.stderr, flush=True)
                results.setdefault(name, []).append(SCENARIOS[name](args, Path(tmp)))
    report = render(results, command)
    print(report)
    if args.write:
        write_results(report, append=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
