"""What is measured: the workloads under wrk, and a streamed upload's memory.

Each scenario starts one server, checks one answer, measures, checks the answer again and
stops the server; a failure becomes the row's error, never an exception out of the run.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from benchmarks.load import MIB, WrkResult, run_wrk, stream_upload, wrk_script
from benchmarks.processes import PAGE_TICKS, TreeSampler, tree_snapshot
from benchmarks.servers import ServerError, Setup, post, running, server_for, split_cores

__all__ = [
    "WORKLOADS",
    "LoadSpec",
    "Row",
    "UploadRow",
    "Workload",
    "bench_one",
    "bench_upload",
    "check_answer",
    "median_row",
]


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


@dataclass(frozen=True)
class LoadSpec:
    """How hard and how long wrk loads each server."""

    duration: float
    warmup: float
    threads: int
    connections: int
    runtime_path: str = "/"


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
    peak_pss_mib: float = 0.0
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


def check_answer(w: Workload, got: Any) -> None:
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


def bench_one(load: LoadSpec, setup: Setup, target: str, workers: int, w: Workload) -> Row:
    """Start one server, check one answer, warm up, measure under wrk, stop it."""
    row = Row(target, workers, w.name)
    server = server_for(setup, target, workers, w.handler_dir)
    path = load.runtime_path if target in ("runtime", "runtime-baseline") else w.bare_path
    script = wrk_script(setup.tmp, w.name, w.content_type, w.body)
    cpu = "1" if split_cores(setup.pin, workers) else None

    def wrk(duration: float) -> WrkResult:
        url = f"http://127.0.0.1:{server.port}{path}"
        return run_wrk(
            url,
            script,
            duration=duration,
            threads=load.threads,
            connections=load.connections,
            cpu=cpu,
        )

    try:
        with running(server, setup) as srv:
            row.ready_s = srv.ready_s
            check_answer(w, post(srv.port, path, w.content_type, w.body))
            # The kernel's peaks, and a sample a second: see TreeSampler.
            with TreeSampler(srv.pid, interval=1.0, high_water=True) as sampler:
                if load.warmup > 0:
                    wrk(load.warmup)
                _, cpu0 = tree_snapshot(srv.pid)
                t0 = time.monotonic()
                row.wrk = wrk(load.duration)
                _, cpu1 = tree_snapshot(srv.pid)
                elapsed = time.monotonic() - t0
            row.cpu_pct = 100.0 * (cpu1 - cpu0) / PAGE_TICKS / elapsed
            row.peak_sum_mib = sampler.peak_sum_kib / 1024
            row.peak_single_mib = sampler.peak_single_kib / 1024
            row.peak_pss_mib = sampler.peak_pss_kib / 1024
            row.procs = sampler.max_procs
            check_answer(w, post(srv.port, path, w.content_type, w.body))  # still healthy?
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


@dataclass(frozen=True)
class UploadSpec:
    """The streamed upload: its size, the client's socket timeout, extra runtime flags."""

    mib: int
    timeout: float
    runtime_args: list[str]


def bench_upload(spec: UploadSpec, setup: Setup, target: str, mode: str) -> UploadRow:
    """Stream ``spec.mib`` MiB to one worker and record its RSS growth over a warm baseline."""
    row = UploadRow(target, mode)
    total = spec.mib * MIB
    limit = str(max(2 * 1024 * MIB, total + MIB))
    extra = ["--max-body-size", limit]
    if target == "runtime":
        extra += spec.runtime_args
    server = server_for(setup, target, 1, "upload", extra)
    path = "/" if target == "runtime" else "/upload"
    chunked = mode == "chunked"
    try:
        with running(server, setup) as srv:
            # Warm up with a body above the runtime's 1 MiB spool threshold so first-use
            # allocations (imports, pools, temp files) are in the baseline, not the growth.
            got = stream_upload(srv.port, path, 4 * MIB, chunked, spec.timeout)
            if got.get("size") != 4 * MIB:
                raise ServerError(f"warm-up upload returned {got!r}")
            time.sleep(0.5)  # let the warm-up's buffers be freed before the baseline
            before, _ = tree_snapshot(srv.pid)
            with TreeSampler(srv.pid, interval=0.05) as sampler:
                t0 = time.monotonic()
                got = stream_upload(srv.port, path, total, chunked, spec.timeout)
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
