"""Benchmark the ABEJA runtime against a bare aiohttp app, in one run, on this machine.

For every (workers, workload) pair both targets are run back to back, so slow drift in the
machine (thermal, noisy neighbours) hits both sides alike. Each server is a fresh subprocess
on 127.0.0.1 with free ports; it is always stopped (SIGTERM, bounded wait, SIGKILL of its
whole process group) before the next one starts, on every exit path.

Usage: python benchmarks/run.py [--duration 10] [--write-results]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import http.client
import io
import json
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
HANDLERS = BENCH / "handlers"
RESULTS = BENCH / "RESULTS.md"
MIB = 1 << 20
PAGE_TICKS = os.sysconf("SC_CLK_TCK")

# Targets the runtime must meet; this script only measures and reports them.
MIN_SMALL_JSON_RPS_RATIO = 0.7
MAX_P99_RATIO = 2.0
MAX_UPLOAD_RSS_GROWTH_MIB = 64.0
LEFTOVER_GRACE = 3.0  # seconds a server's helpers may take to exit after the main process

# Keep BLAS single-threaded in both servers: with 2 cores shared with wrk, a multi-threaded
# matmul would only add contention and make numpy_1ms numbers depend on thread scheduling.
SERVER_ENV = {
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "PYTHONUNBUFFERED": "1",
}


@dataclass(frozen=True)
class Workload:
    """One request shape: where it goes on each target and what a correct answer looks like."""

    name: str
    handler_dir: str
    bare_path: str
    content_type: str
    body: bytes
    expect: dict[str, Any]


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload(
            "small_json",
            "small_json",
            "/small_json",
            "application/json",
            b'{"total_without_tax": 100}',
            {"total": 100 * 1.08},
        ),
        Workload(
            "binary_1mib",
            "binary",
            "/binary",
            "application/octet-stream",
            bytes(range(256)) * (MIB // 256),
            {"size": MIB},
        ),
        Workload(
            "numpy_1ms",
            "numpy_1ms",
            "/numpy_1ms",
            "application/json",
            b'{"scale": 1.5}',
            {},  # the value depends on the fixed matrices; only shape/status are checked
        ),
    )
}


# --------------------------------------------------------------------------- /proc sampling


class ProcInfo(NamedTuple):
    """The /proc/PID/stat fields the harness needs."""

    state: str
    ppid: int
    pgrp: int
    cpu_ticks: int


def _proc_table() -> dict[int, ProcInfo]:
    """pid -> ProcInfo for every process (zombies included), from /proc/*/stat."""
    table: dict[int, ProcInfo] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                raw = f.read()
        except OSError:
            continue  # exited while we were scanning
        # comm may contain spaces and parens; the fields we need follow the last ')'.
        fields = raw[raw.rfind(b")") + 2 :].split()
        table[int(entry.name)] = ProcInfo(
            fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[11]) + int(fields[12])
        )
    return table


def _descendants(root: int, table: dict[int, ProcInfo]) -> list[int]:
    """root plus all its descendants that are alive in ``table``."""
    children: dict[int, list[int]] = {}
    for pid, info in table.items():
        children.setdefault(info.ppid, []).append(pid)
    out: list[int] = []
    stack = [root] if root in table else []
    while stack:
        pid = stack.pop()
        out.append(pid)
        stack.extend(children.get(pid, ()))
    return out


def _rss_kib(pid: int) -> int | None:
    """VmRSS of one process in KiB, or None if it is gone (or a zombie without one)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def tree_snapshot(root: int) -> tuple[dict[int, int], int]:
    """(pid -> RSS KiB, CPU ticks) for the process tree under ``root``."""
    table = _proc_table()
    pids = _descendants(root, table)
    rss = {pid: kib for pid in pids if (kib := _rss_kib(pid)) is not None}
    return rss, sum(table[pid].cpu_ticks for pid in pids)


class TreeSampler:
    """Samples RSS of a process tree on a background thread and keeps the peaks.

    Reports both the peak of the sum (what the whole server costs) and the peak of the
    largest single process (what one worker costs; the sum double-counts shared pages).
    """

    def __init__(self, root: int, interval: float = 0.1) -> None:
        self.root = root
        self.interval = interval
        self.peak_sum_kib = 0
        self.peak_single_kib = 0
        self.max_procs = 0
        self.peak_by_pid: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def sample(self) -> dict[int, int]:
        """Take one sample now and fold it into the peaks."""
        rss, _ = tree_snapshot(self.root)
        if rss:
            self.peak_sum_kib = max(self.peak_sum_kib, sum(rss.values()))
            self.peak_single_kib = max(self.peak_single_kib, max(rss.values()))
            self.max_procs = max(self.max_procs, len(rss))
            for pid, kib in rss.items():
                self.peak_by_pid[pid] = max(self.peak_by_pid.get(pid, 0), kib)
        return rss

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> TreeSampler:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sample()


# --------------------------------------------------------------------------- server lifecycle


def split_cores(pin: str, workers: int) -> bool:
    """Whether to put the server on CPU 0 and wrk on CPU 1 for this row.

    With one worker, splitting gives both targets the same single core and keeps wrk from
    stealing it; with more workers than one core, splitting would serialise the workers.
    """
    return pin == "split" or (pin == "auto" and workers == 1)


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1 (tiny race until the server binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http_status(port: int, path: str, timeout: float = 1.0) -> int | None:
    """GET status code, or None if nothing answers yet."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (OSError, http.client.HTTPException):
        return None


def _tail(path: Path, n: int = 25) -> str:
    """Last lines of a server log, for error messages."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-n:]) or "(empty log)"


class ServerError(RuntimeError):
    """The server did not start, answered wrongly, or could not be stopped."""


@dataclass
class Server:
    """A server subprocess in its own session, so its whole tree can be killed at once."""

    target: str
    cmd: list[str]
    cwd: Path
    env: dict[str, str]
    log: Path
    port: int
    healthcheck_port: int
    proc: subprocess.Popen[bytes] | None = None
    ready_s: float = 0.0
    leftovers: list[int] = field(default_factory=list)

    def start(self) -> None:
        """Spawn the server; stdout/stderr go to a log file, never to our terminal."""
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                self.cmd,
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_ready(self, timeout: float) -> float:
        """Poll /health_check until 200; return seconds taken. Bounded by ``timeout``."""
        assert self.proc is not None
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise ServerError(
                    f"{self.target} exited with {self.proc.returncode} before ready:\n"
                    + _tail(self.log)
                )
            if _http_status(self.port, "/health_check") == 200:
                self.ready_s = time.monotonic() - t0
                return self.ready_s
            time.sleep(0.1)
        raise ServerError(f"{self.target} not ready after {timeout:.0f}s:\n" + _tail(self.log))

    def stop(self, timeout: float) -> None:
        """SIGTERM, wait up to ``timeout``, then SIGKILL the whole process group."""
        if self.proc is None:
            return
        pgid = self.proc.pid
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                print(
                    f"  ! {self.target} ignored SIGTERM for {timeout:.0f}s, SIGKILL",
                    file=sys.stderr,
                )
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
                self.proc.wait(timeout=timeout)
        # Helpers may outlive the main process briefly (multiprocessing's resource tracker
        # exits on EOF from its parent); zombies waiting for init are not leftovers either.
        # Anything still running after LEFTOVER_GRACE seconds is reported, then killed.
        t0 = time.monotonic()
        while time.monotonic() - t0 < LEFTOVER_GRACE + timeout:
            alive = [
                pid
                for pid, info in _proc_table().items()
                if info.pgrp == pgid and info.state != "Z"
            ]
            if not alive:
                break
            if time.monotonic() - t0 >= LEFTOVER_GRACE:
                if not self.leftovers:
                    self.leftovers = alive
                    print(f"  ! {self.target} left processes {alive} behind", file=sys.stderr)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
            time.sleep(0.1)


@dataclass
class Config:
    """Everything that shapes how servers are started and loaded."""

    runtime_cmd: list[str]
    runtime_src: Path  # put first on the runtime's PYTHONPATH
    runtime_src_desc: str
    runtime_args: list[str]
    pin: str
    ready_timeout: float
    stop_timeout: float
    tmp: Path


def server_for(
    cfg: Config, target: str, workers: int, handler_dir: str, extra: list[str] | None = None
) -> Server:
    """Build (not start) the server command for ``target``."""
    port, hc_port = free_port(), free_port()
    while hc_port == port:
        hc_port = free_port()
    common = [
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--healthcheck-port",
        str(hc_port),
        "--workers",
        str(workers),
    ]
    env = {**os.environ, **SERVER_ENV}
    if target == "bare":
        cmd = [sys.executable, str(BENCH / "bare_app.py"), *common]
        cwd = BENCH
    else:
        cmd = [*cfg.runtime_cmd, "--handler", "main:handler", *common, *cfg.runtime_args]
        cwd = HANDLERS / handler_dir
        # Test this checkout (or --runtime-ref), not whatever copy is installed elsewhere.
        src = str(cfg.runtime_src)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    cmd += extra or []
    if split_cores(cfg.pin, workers):
        cmd = ["taskset", "-c", "0", *cmd]
    log = cfg.tmp / f"{target}-w{workers}-{handler_dir}-{port}.log"
    return Server(target, cmd, cwd, env, log, port, hc_port)


def runtime_source(ref: str, tmp: Path) -> tuple[Path, str]:
    """Where the runtime is imported from: the working tree, or ``ref`` exported read-only.

    ``git archive`` leaves the repository untouched (no worktree, no checkout).
    """
    if not ref:
        return REPO, f"working tree {REPO}"
    sha = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", f"{ref}^{{commit}}"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.strip()
    dest = tmp / "runtime-src"
    dest.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", sha, "abeja_runtime"],
        capture_output=True,
        timeout=60,
        check=True,
    )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        if hasattr(tarfile, "data_filter"):  # Python >= 3.10.12 / 3.11.4
            tar.extractall(dest, filter="data")
        else:  # our own repository's tree, so the unfiltered form is acceptable
            tar.extractall(dest)
    return dest, f"git {ref} = {sha[:12]} (exported with git archive)"


@contextlib.contextmanager
def running(server: Server, cfg: Config) -> Iterator[Server]:
    """Start and wait for ``server``; stop it on every exit path."""
    try:
        server.start()
        server.wait_ready(cfg.ready_timeout)
        yield server
    finally:
        server.stop(cfg.stop_timeout)


def post(port: int, path: str, content_type: str, body: bytes, timeout: float = 30) -> Any:
    """One POST returning parsed JSON; raises ServerError on a non-200 or non-JSON answer."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": content_type})
        resp = conn.getresponse()
        data = resp.read()
    finally:
        conn.close()
    if resp.status != 200:
        raise ServerError(f"POST {path} -> {resp.status}: {data[:300]!r}")
    try:
        return json.loads(data)
    except ValueError as e:
        raise ServerError(f"POST {path} -> non-JSON body {data[:300]!r}") from e


# --------------------------------------------------------------------------- wrk


WRK_LUA = """\
-- generated by benchmarks/run.py
local f = assert(io.open({body_path}, "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = {content_type}
"""

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3, "h": 3600e3}


def _ms(value: str, unit: str) -> float:
    return float(value) * _UNITS[unit]


@dataclass
class WrkResult:
    """What we keep from one wrk run (latencies in ms)."""

    rps: float
    p50_ms: float
    p99_ms: float
    requests: int
    errors: int


def parse_wrk(out: str) -> WrkResult:
    """Parse wrk's text output (needs ``--latency`` for the percentile table)."""
    pct = {
        m.group(1): _ms(m.group(2), m.group(3))
        for m in re.finditer(r"^\s*(50|99)(?:\.0+)?%\s+([\d.]+)(us|ms|s|m|h)\s*$", out, re.M)
    }
    rps = re.search(r"^Requests/sec:\s+([\d.]+)", out, re.M)
    total = re.search(r"^\s*(\d+) requests in", out, re.M)
    if not (rps and total and "50" in pct and "99" in pct):
        raise ValueError(f"cannot parse wrk output:\n{out}")
    errors = 0
    if m := re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out):
        errors += int(m.group(1))
    if m := re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out):
        errors += sum(int(g) for g in m.groups())
    return WrkResult(float(rps.group(1)), pct["50"], pct["99"], int(total.group(1)), errors)


def wrk_script(tmp: Path, w: Workload) -> Path:
    """Write the POST body and a Lua script that loads it; return the script path."""
    body_path = tmp / f"{w.name}.body"
    body_path.write_bytes(w.body)
    script = tmp / f"{w.name}.lua"
    script.write_text(
        WRK_LUA.format(
            body_path=json.dumps(str(body_path)), content_type=json.dumps(w.content_type)
        )
    )
    return script


def run_wrk(
    args: argparse.Namespace, url: str, script: Path, duration: float, workers: int
) -> WrkResult:
    """Run wrk once with a hard subprocess timeout."""
    cmd = [
        "wrk",
        f"-t{args.threads}",
        f"-c{args.connections}",
        f"-d{duration:g}s",
        "--latency",
        "--timeout",
        "10s",
        "-s",
        str(script),
        url,
    ]
    if split_cores(args.pin, workers):
        cmd = ["taskset", "-c", "1", *cmd]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 60, check=False)
    if proc.returncode != 0:
        raise ServerError(f"wrk failed ({proc.returncode}): {proc.stderr.strip()}")
    return parse_wrk(proc.stdout)


# --------------------------------------------------------------------------- scenarios


@dataclass
class Row:
    """One (target, workers, workload) measurement, or the reason it has none."""

    target: str
    workers: int
    workload: str
    wrk: WrkResult | None = None
    cpu_pct: float = 0.0
    peak_sum_mib: float = 0.0
    peak_single_mib: float = 0.0
    procs: int = 0
    ready_s: float = 0.0
    error: str = ""
    rps_runs: list[float] = field(default_factory=list)


def median_row(runs: list[Row]) -> Row:
    """The run with the median req/s (lower middle for even counts), keeping every req/s.

    The machine is shared, so single runs can be off by 20%; the median of a few
    interleaved runs is what the ratios are computed from.
    """
    ok = sorted((r for r in runs if r.wrk is not None), key=lambda r: r.wrk.rps if r.wrk else 0)
    if not ok:
        return runs[0]
    row = ok[(len(ok) - 1) // 2]
    row.rps_runs = [r.wrk.rps for r in runs if r.wrk is not None]
    failed = [r.error for r in runs if r.wrk is None]
    if failed and not row.error:
        row.error = f"{len(failed)} of {len(runs)} runs failed: {failed[0].splitlines()[0]}"
    return row


def _check_answer(w: Workload, got: Any) -> None:
    """Fail fast if a target answers something other than the workload's expected JSON."""
    if not isinstance(got, dict):
        raise ServerError(f"{w.name}: expected a JSON object, got {got!r}")
    for key, value in w.expect.items():
        if key not in got or (
            got[key] != value
            and not (isinstance(value, float) and abs(float(got[key]) - value) < 1e-6)
        ):
            raise ServerError(f"{w.name}: expected {w.expect}, got {got!r}")
    if w.name == "numpy_1ms" and not isinstance(got.get("result"), float):
        raise ServerError(f"{w.name}: expected a float 'result', got {got!r}")


def bench_one(args: argparse.Namespace, cfg: Config, target: str, workers: int, w: Workload) -> Row:
    """Start one server, check one answer, warm up, measure under wrk, stop it."""
    row = Row(target, workers, w.name)
    server = server_for(cfg, target, workers, w.handler_dir)
    path = w.bare_path if target == "bare" else args.runtime_path
    script = wrk_script(cfg.tmp, w)
    try:
        with running(server, cfg) as srv:
            assert srv.proc is not None
            row.ready_s = srv.ready_s
            _check_answer(w, post(srv.port, path, w.content_type, w.body))
            url = f"http://127.0.0.1:{srv.port}{path}"
            with TreeSampler(srv.proc.pid) as sampler:
                if args.warmup > 0:
                    run_wrk(args, url, script, args.warmup, workers)
                _, cpu0 = tree_snapshot(srv.proc.pid)
                t0 = time.monotonic()
                row.wrk = run_wrk(args, url, script, args.duration, workers)
                _, cpu1 = tree_snapshot(srv.proc.pid)
                elapsed = time.monotonic() - t0
            row.cpu_pct = 100.0 * (cpu1 - cpu0) / PAGE_TICKS / elapsed
            row.peak_sum_mib = sampler.peak_sum_kib / 1024
            row.peak_single_mib = sampler.peak_single_kib / 1024
            row.procs = sampler.max_procs
            _check_answer(w, post(srv.port, path, w.content_type, w.body))  # still healthy?
        if server.leftovers:
            row.error = f"left {len(server.leftovers)} process(es) after SIGTERM"
    except (ServerError, ValueError, OSError, subprocess.TimeoutExpired) as e:
        row.error = str(e).strip()
        print(f"  ! {target} w{workers} {w.name}: {row.error}", file=sys.stderr)
    return row


@dataclass
class UploadRow:
    """One streamed upload: did the size come back, and how much did the worker's RSS grow."""

    target: str
    mode: str
    size: int | None = None
    seconds: float = 0.0
    worker_before_mib: float = 0.0
    worker_peak_mib: float = 0.0
    worker_growth_mib: float = 0.0
    tree_growth_mib: float = 0.0
    error: str = ""


def stream_upload(port: int, path: str, total: int, chunked: bool, timeout: float) -> Any:
    """POST ``total`` generated bytes in 1 MiB writes; the client never holds more than 1 MiB.

    ``chunked`` uses Transfer-Encoding: chunked (the server cannot know the size up front);
    otherwise a Content-Length is sent and the body is written raw.
    """
    block = os.urandom(MIB)

    def body() -> Iterator[bytes]:
        sent = 0
        while sent < total:
            n = min(MIB, total - sent)
            yield block if n == MIB else block[:n]
            sent += n

    headers = {"Content-Type": "application/octet-stream"}
    if not chunked:
        headers["Content-Length"] = str(total)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        # If the server answers early (e.g. 413) the write fails; the response says why.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            conn.request("POST", path, body=body(), headers=headers, encode_chunked=chunked)
        resp = conn.getresponse()
        data = resp.read()
    finally:
        conn.close()
    if resp.status != 200:
        raise ServerError(f"upload -> {resp.status}: {data[:300]!r}")
    return json.loads(data)


def bench_upload(args: argparse.Namespace, cfg: Config, target: str, mode: str) -> UploadRow:
    """Stream ``--upload-mib`` MiB to one worker and record its RSS growth over a warm baseline."""
    row = UploadRow(target, mode)
    total = args.upload_mib * MIB
    limit = str(max(2 * 1024 * MIB, total + MIB))
    extra = ["--max-body-size", limit]
    if target == "runtime":
        extra += args.upload_runtime_args
    server = server_for(cfg, target, 1, "upload", extra)
    path = "/upload" if target == "bare" else args.runtime_path
    chunked = mode == "chunked"
    try:
        with running(server, cfg) as srv:
            assert srv.proc is not None
            # Warm up with a body above the runtime's 1 MiB spool threshold so first-use
            # allocations (imports, pools, temp files) are in the baseline, not the growth.
            got = stream_upload(srv.port, path, 4 * MIB, chunked, args.upload_timeout)
            if got.get("size") != 4 * MIB:
                raise ServerError(f"warm-up upload returned {got!r}")
            time.sleep(0.5)
            before, _ = tree_snapshot(srv.proc.pid)
            with TreeSampler(srv.proc.pid, interval=0.05) as sampler:
                t0 = time.monotonic()
                got = stream_upload(srv.port, path, total, chunked, args.upload_timeout)
                row.seconds = time.monotonic() - t0
                time.sleep(0.3)  # catch anything freed (or not) right after the response
            row.size = got.get("size")
            growth = {pid: peak - before.get(pid, 0) for pid, peak in sampler.peak_by_pid.items()}
            worker = max(growth, key=lambda pid: growth[pid])
            row.worker_before_mib = before.get(worker, 0) / 1024
            row.worker_peak_mib = sampler.peak_by_pid[worker] / 1024
            row.worker_growth_mib = growth[worker] / 1024
            row.tree_growth_mib = (sampler.peak_sum_kib - sum(before.values())) / 1024
            if row.size != total:
                row.error = f"returned size {row.size}, sent {total}"
        if server.leftovers and not row.error:
            row.error = f"left {len(server.leftovers)} process(es) after SIGTERM"
    except (ServerError, ValueError, OSError, subprocess.TimeoutExpired) as e:
        row.error = str(e).strip()
        print(f"  ! upload {target} {mode}: {row.error}", file=sys.stderr)
    return row


# --------------------------------------------------------------------------- report


def _cmd_output(cmd: list[str]) -> str:
    """First line of a command's output, or '?' (for machine/version info only)."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    out = (p.stdout or p.stderr).strip().splitlines()
    return out[0].strip() if out else "?"


def machine_info(cfg: Config) -> list[tuple[str, str]]:
    """What the numbers depend on, so a reader can tell whether two runs are comparable."""
    from importlib.metadata import PackageNotFoundError, version

    def ver(pkg: str) -> str:
        try:
            return version(pkg)
        except PackageNotFoundError:
            return "not installed"

    cpu = "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    commit = _cmd_output(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"])
    dirty = _cmd_output(["git", "-C", str(REPO), "status", "--porcelain", "--", "abeja_runtime"])
    return [
        ("date", dt.datetime.now().astimezone().isoformat(timespec="seconds")),
        ("nproc", f"{os.cpu_count()} (usable: {len(os.sched_getaffinity(0))})"),
        ("CPU", cpu),
        ("kernel", platform.release()),
        ("load average at start", " ".join(f"{x:.2f}" for x in os.getloadavg())),
        ("Python", f"{platform.python_version()} ({sys.executable})"),
        ("aiohttp", ver("aiohttp")),
        ("numpy", ver("numpy")),
        ("wrk", _cmd_output(["wrk", "-v"]).split("Copyright")[0].strip()),
        (
            "git HEAD",
            commit + (" (abeja_runtime/ has uncommitted changes)" if dirty != "?" else ""),
        ),
        ("runtime command", shlex.join(cfg.runtime_cmd)),
        ("runtime source", cfg.runtime_src_desc),
    ]


def _fmt(x: float, digits: int = 2) -> str:
    return f"{x:,.{digits}f}"


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def render(
    args: argparse.Namespace,
    cfg: Config,
    rows: list[Row],
    uploads: list[UploadRow],
    info: list[tuple[str, str]],
) -> str:
    """The Markdown report: machine, command, throughput table, ratios, upload memory."""
    out = [f"## Run {info[0][1]}", ""]
    out += [f"- **{k}**: {v}" for k, v in info[1:]]
    out += ["", "Command:", "", "```", shlex.join(["python", *sys.argv]), "```", ""]
    pin = {
        "split": "server on CPU 0, wrk on CPU 1 (taskset), for every row",
        "none": "none (server and wrk share both cores)",
        "auto": "1-worker rows: server on CPU 0, wrk on CPU 1 (taskset); "
        "2-worker rows: none (server and wrk share both cores)",
    }[args.pin]
    out += [
        f"Load: `wrk -t{args.threads} -c{args.connections} -d{args.duration:g}s --latency`, "
        f"{args.warmup:g} s unrecorded warm-up per server, pinning: {pin}. "
        "BLAS limited to 1 thread in both servers."
        + (
            f" Each row is the median-req/s run of {args.repeat} interleaved runs "
            "(range in brackets)."
            if args.repeat > 1
            else ""
        ),
        "",
        "| target | workers | workload | req/s | p50 ms | p99 ms | errors | server CPU % "
        "| peak RSS sum MiB | peak RSS largest proc MiB | procs |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r.wrk is None:
            reason = r.error.splitlines()[0][:120] if r.error else "no result"
            out.append(
                f"| {r.target} | {r.workers} | {r.workload} | — | — | — | {reason} | | | | |"
            )
            continue
        errs = str(r.wrk.errors) + (f" ({r.error})" if r.error else "")
        rps = _fmt(r.wrk.rps, 0)
        if len(r.rps_runs) > 1:
            rps += f" ({_fmt(min(r.rps_runs), 0)}..{_fmt(max(r.rps_runs), 0)})"
        out.append(
            f"| {r.target} | {r.workers} | {r.workload} | {rps} "
            f"| {_fmt(r.wrk.p50_ms)} | {_fmt(r.wrk.p99_ms)} | {errs} | {_fmt(r.cpu_pct, 0)} "
            f"| {_fmt(r.peak_sum_mib, 1)} | {_fmt(r.peak_single_mib, 1)} | {r.procs} |"
        )

    by_key = {(r.target, r.workers, r.workload): r for r in rows}
    ratio_lines = []
    for workers in args.workers:
        for name in args.workloads:
            bare, rt = by_key.get(("bare", workers, name)), by_key.get(("runtime", workers, name))
            if not (bare and rt and bare.wrk and rt.wrk and bare.wrk.rps and bare.wrk.p99_ms):
                continue
            rps_ratio = rt.wrk.rps / bare.wrk.rps
            p99_ratio = rt.wrk.p99_ms / bare.wrk.p99_ms
            checks = [f"p99 ≤ {MAX_P99_RATIO:g}x: {_verdict(p99_ratio <= MAX_P99_RATIO)}"]
            if name == "small_json" and workers == 1:
                ok = rps_ratio >= MIN_SMALL_JSON_RPS_RATIO
                checks.insert(0, f"req/s ≥ {MIN_SMALL_JSON_RPS_RATIO:g}x: {_verdict(ok)}")
            if rt.wrk.errors:
                checks.append(f"{rt.wrk.errors} errors: FAIL")
            ratio_lines.append(
                f"| {workers} | {name} | {rps_ratio:.2f} | {p99_ratio:.2f} | {'; '.join(checks)} |"
            )
    if ratio_lines:
        out += [
            "",
            "Runtime / bare (req/s: higher is better; p99: lower is better):",
            "",
            "| workers | workload | req/s ratio | p99 ratio | targets |",
            "|---:|---|---:|---:|---|",
            *ratio_lines,
        ]

    if uploads:
        out += [
            "",
            f"Streamed upload of {args.upload_mib} MiB to one worker (1 MiB client writes; "
            "growth = peak RSS during the upload minus RSS after a 4 MiB warm-up upload; "
            "'worker' = the process whose RSS grew most):",
            "",
            "| target | mode | returned size | seconds | MiB/s | worker RSS before MiB "
            f"| worker RSS peak MiB | worker growth MiB | tree growth MiB | growth < "
            f"{MAX_UPLOAD_RSS_GROWTH_MIB:g} MiB |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for u in uploads:
            if u.error and u.size is None:
                out.append(
                    f"| {u.target} | {u.mode} | {u.error.splitlines()[0][:120]} |" + " |" * 7
                )
                continue
            ok = u.worker_growth_mib < MAX_UPLOAD_RSS_GROWTH_MIB and not u.error
            rate = args.upload_mib / u.seconds if u.seconds else 0.0
            verdict = _verdict(ok) if u.target == "runtime" else ("(baseline) " + _verdict(ok))
            out.append(
                f"| {u.target} | {u.mode} | {u.size}{' ' + u.error if u.error else ''} "
                f"| {_fmt(u.seconds)} | {_fmt(rate, 0)} | {_fmt(u.worker_before_mib, 1)} "
                f"| {_fmt(u.worker_peak_mib, 1)} | {_fmt(u.worker_growth_mib, 1)} "
                f"| {_fmt(u.tree_growth_mib, 1)} | {verdict} |"
            )
    return "\n".join(out) + "\n"


RESULTS_HEADER = """\
# Benchmark results

Generated by `python benchmarks/run.py --write-results`; see benchmarks/README.md for what
the workloads are and how to read the columns. wrk and the server share the same 2 cores,
so absolute numbers understate a dedicated server; compare runtime to bare within one run.

"""


def write_results(report: str, append: bool) -> None:
    """Rewrite RESULTS.md with this run (or append it under the earlier runs)."""
    if append and RESULTS.exists():
        previous = RESULTS.read_text().rstrip("\n")
        RESULTS.write_text(previous + "\n\n" + report)
    else:
        RESULTS.write_text(RESULTS_HEADER + report)


# --------------------------------------------------------------------------- main


def _csv(kind: type, allowed: set[str] | None = None) -> Any:
    """argparse type for comma-separated lists."""

    def parse(text: str) -> list[Any]:
        items = [kind(x) for x in text.split(",") if x]
        if allowed is not None and (bad := set(items) - allowed):
            raise argparse.ArgumentTypeError(f"unknown: {', '.join(sorted(bad))}")
        return items

    return parse


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line flags; the defaults are the documented benchmark."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=10, help="seconds of measured wrk load")
    p.add_argument("--warmup", type=float, default=2, help="unrecorded wrk seconds first")
    p.add_argument(
        "--repeat", type=int, default=1, help="runs per row, interleaved; the median is kept"
    )
    p.add_argument("--threads", type=int, default=2, help="wrk -t")
    p.add_argument("--connections", type=int, default=16, help="wrk -c")
    p.add_argument("--targets", type=_csv(str, {"bare", "runtime"}), default=["bare", "runtime"])
    p.add_argument("--workers", type=_csv(int), default=[1, 2])
    p.add_argument("--workloads", type=_csv(str, set(WORKLOADS)), default=list(WORKLOADS))
    p.add_argument(
        "--pin",
        choices=["auto", "none", "split"],
        default="none",
        help="split: taskset server to CPU 0 and wrk to CPU 1; auto: split only for 1 worker "
        "(see README for why)",
    )
    p.add_argument(
        "--runtime-cmd",
        default=shlex.join([sys.executable, "-m", "abeja_runtime"]),
        help="how to start the runtime (this checkout is put on PYTHONPATH)",
    )
    p.add_argument(
        "--runtime-ref",
        default="",
        help="benchmark abeja_runtime/ as of this git commit (exported to a temp dir) instead "
        "of the working tree, which other people may be editing mid-run",
    )
    p.add_argument("--runtime-args", default="", help="extra runtime flags, e.g. '--concurrency 8'")
    p.add_argument("--runtime-path", default="/", help="URL path the runtime serves handlers on")
    p.add_argument("--skip-upload", action="store_true", help="skip the streamed upload test")
    p.add_argument("--upload-mib", type=int, default=1024, help="size of the streamed upload")
    p.add_argument(
        "--upload-modes",
        type=_csv(str, {"content-length", "chunked"}),
        default=["content-length", "chunked"],
    )
    p.add_argument(
        "--upload-runtime-args",
        default="",
        help="extra runtime flags for the upload test only (--max-body-size is always set)",
    )
    p.add_argument("--upload-timeout", type=float, default=300, help="socket timeout, seconds")
    p.add_argument("--ready-timeout", type=float, default=60)
    p.add_argument("--stop-timeout", type=float, default=10)
    p.add_argument("--write-results", action="store_true", help="write benchmarks/RESULTS.md")
    p.add_argument("--append", action="store_true", help="append to RESULTS.md, do not rewrite")
    p.add_argument("--note", default="", help="free text for the report, e.g. what else ran")
    args = p.parse_args(argv)
    args.runtime_args = shlex.split(args.runtime_args)
    args.upload_runtime_args = shlex.split(args.upload_runtime_args)
    return args


def _raise_interrupt(signum: int, frame: object) -> None:
    """Turn SIGTERM into KeyboardInterrupt so every finally block stops its server."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Run the matrix and the upload test, print the report, optionally write RESULTS.md."""
    args = parse_args(argv)
    if shutil.which("wrk") is None:
        print("wrk not found on PATH (apt-get install wrk)", file=sys.stderr)
        return 2
    if args.pin != "none" and shutil.which("taskset") is None:
        print("--pin split needs taskset (util-linux)", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _raise_interrupt)

    rows: list[Row] = []
    uploads: list[UploadRow] = []
    with tempfile.TemporaryDirectory(prefix="abeja-bench-") as tmp:
        try:
            src, src_desc = runtime_source(args.runtime_ref, Path(tmp))
        except (OSError, subprocess.SubprocessError) as e:
            print(f"cannot export abeja_runtime at {args.runtime_ref}: {e}", file=sys.stderr)
            return 2
        cfg = Config(
            runtime_cmd=shlex.split(args.runtime_cmd),
            runtime_src=src,
            runtime_src_desc=src_desc,
            runtime_args=args.runtime_args,
            pin=args.pin,
            ready_timeout=args.ready_timeout,
            stop_timeout=args.stop_timeout,
            tmp=Path(tmp),
        )
        info = machine_info(cfg)
        # Interleave targets per (workers, workload) so drift hits both sides alike.
        for workers in args.workers:
            for name in args.workloads:
                runs: dict[str, list[Row]] = {t: [] for t in args.targets}
                for rep in range(args.repeat):
                    for target in args.targets:
                        print(
                            f"- {target} workers={workers} {name} run {rep + 1}/{args.repeat}",
                            file=sys.stderr,
                            flush=True,
                        )
                        runs[target].append(bench_one(args, cfg, target, workers, WORKLOADS[name]))
                rows += [median_row(runs[t]) for t in args.targets]
        if not args.skip_upload:
            for mode in args.upload_modes:
                for target in args.targets:
                    print(f"- upload {args.upload_mib} MiB {target} {mode}", file=sys.stderr)
                    uploads.append(bench_upload(args, cfg, target, mode))

    info.insert(5, ("load average at end", " ".join(f"{x:.2f}" for x in os.getloadavg())))
    if args.note:
        info.append(("note", args.note))
    report = render(args, cfg, rows, uploads, info)
    print(report)
    if args.write_results:
        write_results(report, args.append)
        print(f"wrote {RESULTS.relative_to(REPO)}", file=sys.stderr)
    failed = any(r.error for r in rows) or any(u.error for u in uploads)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
