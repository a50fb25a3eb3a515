"""Adaptive batching, measured: the runtime unbatched and batched, Ray Serve and LitServe, all
serving the same fixed-cost model under 64 connections, and one client's latency.

    python -m benchmarks.batching [--duration 10] [--repeat 3] [--targets ...] [--write]

The model (``handlers/batching/model.py``): each call costs a fixed 2 ms (``time.sleep``,
standing for a GPU kernel launch) plus a 256 x 256 float32 matmul per request, one
``np.matmul`` over the stacked batch; ``{"scale": 1.5}`` is answered ``{"sum": ...}``.

Targets (``--targets``, in this order):

* ``runtime``: ``handler(request, context)``, 1 worker, defaults;
* ``runtime-batched``: ``handler(requests, context)`` with ``--max-batch-size 32
  --max-batch-wait 0.005``, 1 worker;
* ``ray``: Ray Serve, ``@serve.batch(max_batch_size=32, batch_wait_timeout_s=0.005)``, one
  replica behind its own HTTP proxy, defaults otherwise (``peers/ray_batch.py``);
* ``ray-ongoing64``: the same with ``max_ongoing_requests=64``: Ray's default of 5 requests
  in flight per replica caps its batches at 5 (Ray logs a warning saying so);
* ``litserve``: LitServe, ``max_batch_size=32, batch_timeout=0.005``, 1 worker, defaults
  otherwise (``peers/litserve_batch.py``).

The peers run with their own Pythons (``--ray-python``, ``--litserve-python``; by default
``/work/venvs/ray/bin/python`` and ``/work/venvs/litserve/bin/python`` when they exist, made
with ``python -m venv`` and ``pip install "ray[serve]" numpy`` / ``pip install litserve
numpy``); a target whose Python is missing is skipped with the reason. Ray's worker processes
get ``RAY_worker_niceness=0`` unless the variable is set: Ray's default (15) lets every other
process of a shared machine take CPU 0 from its replica and proxy first.

Each server is a fresh subprocess in a session of its own on 127.0.0.1, pinned to CPU 0 with
taskset (Ray's processes inherit it from the launcher); wrk and this script run on CPU 1.
Per repetition and target (targets interleaved, so that drift hits them alike): start, wait
for an HTTP route to say 200 (bounded: ``--ready-timeout``), check one answer, ``--warmup``
seconds of wrk, ``--duration`` seconds of ``wrk -t1 -c64`` (POSTs of the JSON body from a Lua
script), for the runtime targets ``--duration`` seconds of one connection (sequential
requests), check the answer again, stop: SIGTERM, a bounded wait, then SIGKILL to every
process left in the server's session. A target that does not start, answers wrongly or whose
wrk fails is a failed row with the reason, not an exception; Ctrl-C stops the server first.
Each row is the run with the median req/s (for one client: the median p50), with every run's
req/s in brackets. Exit status 1 when a row could not be measured (skipped rows aside).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import importlib.util
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import IO, Any

from abeja_runtime.launch import RuntimeProcess, free_port
from benchmarks.load import WrkResult, run_wrk, wrk_script
from benchmarks.report import write_results
from benchmarks.servers import (
    REPO,
    SERVER_ENV,
    ServerError,
    Setup,
    post,
    running,
    server_for,
    tail,
    terminate,
)

HERE = Path(__file__).resolve().parent
HANDLER_DIR = "batching"
PEERS = HERE / "peers"
BODY = b'{"scale": 1.5}'
SCALE = 1.5
CONTENT_TYPE = "application/json"
MAX_BATCH_SIZE = 32
MAX_BATCH_WAIT = 0.005
DEFAULT_RAY_PYTHON = Path("/work/venvs/ray/bin/python")
DEFAULT_LITSERVE_PYTHON = Path("/work/venvs/litserve/bin/python")
#: Relative tolerance of an answer's ``sum`` (float32 sums over 65,536 products).
TOLERANCE = 1e-3


#: The runtime-batched target's flags (after the common ones; the last --handler wins).
BATCHED_ARGS = (
    "--handler", "main:batch_handler",
    "--max-batch-size", str(MAX_BATCH_SIZE),
    "--max-batch-wait", str(MAX_BATCH_WAIT),
)  # fmt: skip


@dataclass(frozen=True)
class Target:
    """One server configuration: how it is started and where it is asked."""

    name: str
    label: str
    kind: str  # "runtime" | "ray" | "litserve"
    runtime_args: tuple[str, ...] = ()
    peer_args: tuple[str, ...] = ()
    latency: bool = False  # also measure one client


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("runtime", "runtime unbatched", "runtime", latency=True),
        Target(
            "runtime-batched",
            f"runtime batched ({MAX_BATCH_SIZE}, {MAX_BATCH_WAIT:g} s)",
            "runtime",
            BATCHED_ARGS,
            latency=True,
        ),
        Target("ray", "Ray Serve @serve.batch", "ray"),
        Target(
            "ray-ongoing64",
            "Ray Serve @serve.batch, max_ongoing_requests=64",
            "ray",
            peer_args=("--max-ongoing-requests", "64"),
        ),
        Target("litserve", "LitServe", "litserve"),
    )
}


@dataclass
class Run:
    """One measurement of one target under some connections, or why there is none."""

    target: Target
    connections: int
    wrk: WrkResult | None = None
    error: str = ""
    skipped: str = ""
    rps_runs: list[float] = field(default_factory=list)


def _unit_sum() -> float:
    """``model.UNIT_SUM``, from the handler's own file (the answer to ``{"scale": 1}``)."""
    spec = importlib.util.spec_from_file_location(
        "batching_model", HERE / "handlers" / HANDLER_DIR / "model.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return float(module.UNIT_SUM)


def _check(got: Any, expected: float) -> None:
    if not isinstance(got, dict) or not isinstance(got.get("sum"), (int, float)):
        raise ServerError(f'expected {{"sum": <number>}}, got {got!r}')
    if abs(float(got["sum"]) - expected) > TOLERANCE * abs(expected):
        raise ServerError(f"expected sum {expected:.6g}, got {got['sum']!r}")


# -- peers ------------------------------------------------------------------------------------


def _session_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            raw = stat.read()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2 :].split()
    return None if fields[0] == b"Z" else int(fields[3])


def _in_session(sid: int) -> list[int]:
    """Live processes of session ``sid`` (Ray's actors get process groups of their own, but
    stay in the launcher's session)."""
    return [
        int(entry.name)
        for entry in os.scandir("/proc")
        if entry.name.isdigit() and _session_of(int(entry.name)) == sid
    ]


def _get_status(port: int, path: str) -> int | None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        return response.status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


@dataclass
class Peer:
    """A peer's server: its launcher in a session of its own, output to ``log``."""

    name: str
    command: list[str]
    env: dict[str, str]
    cwd: Path
    log: Path
    port: int
    ready_path: str
    process: RuntimeProcess | None = None
    leftovers: list[int] = field(default_factory=list)
    _log_file: IO[bytes] | None = None

    def start(self) -> None:
        self._log_file = self.log.open("wb")
        self.process = RuntimeProcess(
            self.command, cwd=self.cwd, env=self.env, output=self._log_file
        )

    def wait_ready(self, timeout: float) -> float:
        """Poll ``GET ready_path`` until 200, the launcher exits, or ``timeout`` passes."""
        assert self.process is not None
        started = time.monotonic()
        last: int | None = None
        while True:
            code = self.process.exit_code()
            if code is not None:
                raise ServerError(
                    f"{self.name} exited before it was ready (exit code {code}):\n{tail(self.log)}"
                )
            last = _get_status(self.port, self.ready_path)
            if last == 200:
                return time.monotonic() - started
            if time.monotonic() - started >= timeout:
                seen = f"it answered {last}" if last is not None else "it did not answer"
                raise ServerError(
                    f"{self.name} was not ready after {timeout:g} s ({seen} on GET "
                    f"{self.ready_path}):\n{tail(self.log)}"
                )
            time.sleep(0.2)

    def stop(self, timeout: float) -> None:
        """SIGTERM to the launcher, up to ``timeout`` to exit, then SIGKILL to what is left of
        its session (recorded in ``leftovers`` when something was)."""
        if self.process is None:
            return
        popen = self.process.popen
        terminate(popen, self.name, timeout)
        deadline = time.monotonic() + 5
        while (left := _in_session(popen.pid)) and time.monotonic() < deadline:
            time.sleep(0.2)
        self.leftovers = left
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self.process.kill()
        if self._log_file is not None:
            self._log_file.close()


@contextlib.contextmanager
def _peer_running(peer: Peer, ready_timeout: float, stop_timeout: float) -> Iterator[Peer]:
    try:
        peer.start()
        peer.wait_ready(ready_timeout)
        yield peer
    finally:
        peer.stop(stop_timeout)


def _peer(target: Target, python: Path, tmp: Path) -> Peer:
    port = free_port()
    env = {**os.environ, **SERVER_ENV, "RAY_DISABLE_USAGE_STATS": "1"}
    env.setdefault("RAY_worker_niceness", "0")
    env.pop("PYTHONPATH", None)  # the peer's venv, not this checkout
    script = PEERS / ("ray_batch.py" if target.kind == "ray" else "litserve_batch.py")
    command = ["taskset", "-c", "0", str(python), str(script), str(port), *target.peer_args]
    cwd = tmp / f"{target.name}-{port}"
    cwd.mkdir()
    ready = "/health_check" if target.kind == "ray" else "/health"
    return Peer(target.name, command, env, cwd, tmp / f"{target.name}-{port}.log", port, ready)


# -- measuring --------------------------------------------------------------------------------


def _reason(exc: BaseException) -> str:
    """The first line of an error and, when it carries a log, the log's last line."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    text = lines[0] if len(lines) == 1 else f"{lines[0]} … {lines[-1]}"
    return text.replace("|", "/")


def _server_of(
    target: Target, python: Path | None, setup: Setup
) -> tuple[Any, contextlib.AbstractContextManager[Any], str]:
    """The server of ``target``, what runs it, and the path its model answers on."""
    if target.kind == "runtime":
        server = server_for(setup, "runtime", 1, HANDLER_DIR, list(target.runtime_args))
        server.env = {
            key: value
            for key, value in server.env.items()
            if not key.startswith("ABEJA_RUNTIME_") and key not in ("PORT", "HANDLER")
        }
        return server, running(server, setup), "/"
    assert python is not None
    peer = _peer(target, python, setup.tmp)
    context = _peer_running(peer, setup.ready_timeout, setup.stop_timeout)
    return peer, context, "/" if target.kind == "ray" else "/predict"


def _measure_one(
    target: Target, args: argparse.Namespace, setup: Setup, expected: float
) -> list[Run]:
    """Start ``target``, measure it (64 connections; one client too), stop it."""
    runs = [Run(target, args.connections)]
    if target.latency:
        runs.append(Run(target, 1))
    python: Path | None = {"ray": args.ray_python, "litserve": args.litserve_python}.get(
        target.kind
    )
    script = wrk_script(setup.tmp, "batching", CONTENT_TYPE, BODY)
    if target.kind != "runtime" and (python is None or not python.exists()):
        default = DEFAULT_RAY_PYTHON if target.kind == "ray" else DEFAULT_LITSERVE_PYTHON
        missing = f"no Python: {python or default} does not exist (--{target.kind}-python)"
        return [replace(run, skipped=missing) for run in runs]
    server, context, path = _server_of(target, python, setup)
    current = runs[0]
    try:
        with context as srv:
            url = f"http://127.0.0.1:{srv.port}{path}"

            def wrk(duration: float, connections: int) -> WrkResult:
                return run_wrk(
                    url, script, duration=duration, threads=1, connections=connections, cpu="1"
                )

            _check(post(srv.port, path, CONTENT_TYPE, BODY), expected)
            if args.warmup > 0:
                wrk(args.warmup, args.connections)
            for current in runs:
                current.wrk = wrk(args.duration, current.connections)
            _check(post(srv.port, path, CONTENT_TYPE, BODY), expected)  # still right?
        if server.leftovers:
            current.error = f"left {len(server.leftovers)} process(es) after SIGTERM"
    except (ServerError, ValueError, OSError, subprocess.TimeoutExpired) as exc:
        print(f"  ! {target.name}: {str(exc).strip()}", file=sys.stderr)
        for run in runs:
            if run.wrk is None or run is current:
                run.error = _reason(exc)
    return runs


def _median(runs: list[Run]) -> Run:
    """The run with the median req/s (one client: the median p50), keeping every req/s."""
    ok = [run for run in runs if run.wrk is not None]
    if not ok:
        return runs[0]
    if runs[0].connections == 1:
        ok.sort(key=lambda run: run.wrk.p50_ms if run.wrk else 0.0)
    else:
        ok.sort(key=lambda run: run.wrk.rps if run.wrk else 0.0)
    row = ok[(len(ok) - 1) // 2]
    row.rps_runs = [run.wrk.rps for run in runs if run.wrk is not None]
    failed = [run.error for run in runs if run.wrk is None]
    if failed and not row.error:
        row.error = f"{len(failed)} of {len(runs)} runs failed: {failed[0]}"
    return row


# -- report -----------------------------------------------------------------------------------


def _peer_version(python: Path | None, package: str) -> str:
    if python is None or not python.exists():
        return "-"
    try:
        found = subprocess.run(
            [str(python), "-c", f"import importlib.metadata as m; print(m.version({package!r}))"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    return found.stdout.strip() or "?"


def render(rows: list[Run], args: argparse.Namespace, command: str) -> str:
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    lines = [
        f"Batching ({time.strftime('%Y-%m-%d')}; `{command}`; {os.cpu_count()} cores, load "
        f"{load}; Ray {_peer_version(args.ray_python, 'ray')}, LitServe "
        f"{_peer_version(args.litserve_python, 'litserve')}): a model costing 2 ms per call "
        f"plus a 256x256 float32 matmul per request; server on CPU 0, `wrk -t1` on CPU 1, "
        f"{args.duration:g} s runs, median of {args.repeat}.",
        "",
        "| target | connections | req/s | p50 ms | p99 ms | errors | note |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        note = row.skipped and f"skipped: {row.skipped}"
        if row.error:
            note = f"FAILED: {row.error}" if row.wrk is None else row.error
        if row.wrk is None:
            cells = "- | - | - | -"
        else:
            cells = (
                f"{row.wrk.rps:.0f} | {row.wrk.p50_ms:.2f} | {row.wrk.p99_ms:.2f} | "
                f"{row.wrk.errors}"
            )
            if len(row.rps_runs) > 1:
                note = f"[{', '.join(f'{rps:.0f}' for rps in row.rps_runs)}] {note}".strip()
        if len(note) > 300:
            note = note[:299] + "…"
        lines.append(f"| {row.target.label} | {row.connections} | {cells} | {note} |")
    singles = {
        row.target.name: row.wrk.p50_ms
        for row in rows
        if row.connections == 1 and row.wrk is not None
    }
    lines.append("")
    if "runtime" in singles and "runtime-batched" in singles:
        added = singles["runtime-batched"] - singles["runtime"]
        verdict = "PASS" if added <= 1.0 else "FAIL"
        lines.append(
            f"One client: batching adds {added:+.2f} ms to the median latency "
            f"(bound: at most 1 ms): {verdict}."
        )
    else:
        lines.append("One client: no comparison (a runtime row is missing or failed).")
    return "\n".join(lines) + "\n"


# -- command ----------------------------------------------------------------------------------


def _existing(path: Path) -> Path | None:
    return path if path.exists() else None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.batching",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--duration", type=float, default=10, help="seconds of each wrk run")
    parser.add_argument("--warmup", type=float, default=2, help="unrecorded wrk seconds first")
    parser.add_argument("--repeat", type=int, default=3, help="runs per row; the median is kept")
    parser.add_argument("--connections", type=int, default=64, help="wrk -c of the load rows")
    parser.add_argument(
        "--targets",
        type=lambda text: [name for name in text.split(",") if name],
        default=list(TARGETS),
        help=f"comma-separated, of: {','.join(TARGETS)} (default: all)",
    )
    parser.add_argument("--ray-python", type=Path, default=_existing(DEFAULT_RAY_PYTHON))
    parser.add_argument("--litserve-python", type=Path, default=_existing(DEFAULT_LITSERVE_PYTHON))
    parser.add_argument("--ready-timeout", type=float, default=120, help="seconds to start")
    parser.add_argument("--stop-timeout", type=float, default=30, help="seconds to exit")
    parser.add_argument("--write", action="store_true", help="append the table to RESULTS.md")
    args = parser.parse_args(argv)
    if unknown := [name for name in args.targets if name not in TARGETS]:
        parser.error(f"unknown targets: {', '.join(unknown)}")
    if args.repeat < 1 or args.duration <= 0:
        parser.error("--repeat must be at least 1 and --duration positive")
    return args


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    given = sys.argv[1:] if argv is None else argv
    command = shlex.join(["python", "-m", "benchmarks.batching", *given])
    signal.signal(signal.SIGTERM, _interrupt)  # stop the server on the way out, as on Ctrl-C
    os.sched_setaffinity(0, {1})
    expected = SCALE * _unit_sum()
    targets = [TARGETS[name] for name in args.targets]
    measured: dict[tuple[str, int], list[Run]] = {}
    with tempfile.TemporaryDirectory(prefix="abeja-batching-") as tmp:
        setup = Setup(
            runtime_src=REPO,
            runtime_src_desc=f"working tree {REPO}",
            runtime_args=[],
            pin="split",
            ready_timeout=args.ready_timeout,
            stop_timeout=args.stop_timeout,
            tmp=Path(tmp),
        )
        try:
            for repetition in range(args.repeat):
                for target in targets:
                    print(f"{target.name} ({repetition + 1}/{args.repeat})", file=sys.stderr)
                    for run in _measure_one(target, args, setup, expected):
                        measured.setdefault((target.name, run.connections), []).append(run)
        except KeyboardInterrupt:
            print("interrupted: every server was stopped", file=sys.stderr)
            return 130
    rows = [_median(runs) for runs in measured.values()]
    table = render(rows, args, command)
    print(table)
    if args.write:
        write_results(table, append=True)
    return 1 if any(row.wrk is None and not row.skipped for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
