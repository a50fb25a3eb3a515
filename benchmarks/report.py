"""The report: the targets, their verdicts, and the Markdown that goes to RESULTS.md.

The targets are ratios to the bare aiohttp app measured in the same run (issue "one request
pipeline"), plus absolute bounds for start-up and for the memory of a streamed upload. The
verdicts are plain functions of the rows, so they are unit-tested (tests/test_benchmarks.py).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from benchmarks.scenarios import Row, UploadRow
from benchmarks.servers import split_cores

__all__ = [
    "RESULTS",
    "Check",
    "Options",
    "machine_info",
    "ratio_checks",
    "render",
    "start_check",
    "upload_check",
    "write_results",
]

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
RESULTS = BENCH / "RESULTS.md"

#: Runtime req/s at least this share of the bare app's, per (workers, workload), defaults;
#: with N workers the bare app runs N processes (issue 19's targets).
MIN_RPS_RATIO = {
    (1, "small_json"): 0.80,
    (1, "binary_1mib"): 0.90,
    (1, "numpy_1ms"): 0.90,
    (2, "small_json"): 0.70,
    (2, "numpy_1ms"): 0.90,
}
#: Runtime p99 at most this multiple of the bare app's, small JSON.
MAX_SMALL_JSON_P99_RATIO = 1.5
#: Peak memory of the runtime's process tree at most this multiple of the bare app's (1 worker),
#: each page counted once (PSS summed): the workers forked from the template (``--preload``)
#: share its pages, which an RSS sum would count once per process.
MAX_MEMORY_RATIO = 1.5
#: Seconds from start to a healthy ``/health_check`` (the benchmark handlers import little).
MAX_START_S = 0.5
MAX_UPLOAD_RSS_GROWTH_MIB = 64.0


@dataclass(frozen=True)
class Check:
    """One target and whether this run met it."""

    target: str
    ok: bool

    def __str__(self) -> str:
        return f"{self.target}: {'PASS' if self.ok else 'FAIL'}"


def ratio_checks(bare: Row, runtime: Row) -> list[Check]:
    """The targets a runtime row is held to against the bare row of the same workload."""
    assert bare.wrk is not None and runtime.wrk is not None
    checks: list[Check] = []
    if (runtime.workers, runtime.workload) in MIN_RPS_RATIO:
        minimum = MIN_RPS_RATIO[runtime.workers, runtime.workload]
        ratio = runtime.wrk.rps / bare.wrk.rps
        checks.append(Check(f"req/s ≥ {minimum:g}x", ratio >= minimum))
    if runtime.workers == 1 and runtime.workload == "small_json":
        ratio = runtime.wrk.p99_ms / bare.wrk.p99_ms
        checks.append(
            Check(f"p99 ≤ {MAX_SMALL_JSON_P99_RATIO:g}x", ratio <= MAX_SMALL_JSON_P99_RATIO)
        )
    if runtime.workers == 1 and bare.peak_pss_mib:
        ratio = runtime.peak_pss_mib / bare.peak_pss_mib
        checks.append(Check(f"memory (PSS) ≤ {MAX_MEMORY_RATIO:g}x", ratio <= MAX_MEMORY_RATIO))
    if runtime.wrk.errors:
        checks.append(Check(f"{runtime.wrk.errors} errors", False))
    return checks


def start_check(runtime: Row) -> Check:
    return Check(f"start < {MAX_START_S:g} s", 0 < runtime.ready_s < MAX_START_S)


def upload_check(upload: UploadRow) -> Check:
    ok = upload.worker_growth_mib < MAX_UPLOAD_RSS_GROWTH_MIB and not upload.error
    return Check(f"growth < {MAX_UPLOAD_RSS_GROWTH_MIB:g} MiB", ok)


def _cmd_output(cmd: list[str]) -> str:
    """First line of a command's output, or '?' (for machine/version info only)."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    out = (p.stdout or p.stderr).strip().splitlines()
    return out[0].strip() if out else "?"


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def machine_info(runtime_source: str) -> list[tuple[str, str]]:
    """What the numbers depend on, so a reader can tell whether two runs are comparable."""
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
        ("aiohttp", _version("aiohttp")),
        ("uvloop", _version("uvloop")),
        ("numpy", _version("numpy")),
        ("wrk", _cmd_output(["wrk", "-v"]).split("Copyright")[0].strip()),
        (
            "git HEAD",
            commit + (" (abeja_runtime/ has uncommitted changes)" if dirty != "?" else ""),
        ),
        ("runtime source", runtime_source),
    ]


def _fmt(x: float, digits: int = 2) -> str:
    return f"{x:,.{digits}f}"


@dataclass(frozen=True)
class Options:
    """What the report says about how the run was made."""

    command: Sequence[str]
    threads: int
    connections: int
    duration: float
    warmup: float
    repeat: int
    pin: str
    upload_mib: int


_PINNING = {
    "split": "server on CPU 0, wrk on CPU 1 (taskset), for every row",
    "none": "none (server and wrk share both cores)",
    "auto": "1-worker rows: server on CPU 0, wrk on CPU 1 (taskset); "
    "2-worker rows: none (server and wrk share both cores)",
}


def render(
    options: Options, rows: list[Row], uploads: list[UploadRow], info: list[tuple[str, str]]
) -> str:
    """The Markdown report: machine, command, throughput table, ratios, upload memory."""
    out = [f"## Run {info[0][1]}", ""]
    out += [f"- **{k}**: {v}" for k, v in info[1:]]
    out += ["", "Command:", "", "```", shlex.join(options.command), "```", ""]
    repeat = (
        f" Each row is the median-req/s run of {options.repeat} interleaved runs (range in "
        "brackets)."
        if options.repeat > 1
        else ""
    )
    out += [
        f"Load: `wrk -t{options.threads} -c{options.connections} -d{options.duration:g}s "
        f"--latency`, {options.warmup:g} s unrecorded warm-up per server, pinning: "
        f"{_PINNING[options.pin]}. BLAS limited to 1 thread in both servers.{repeat}",
        "",
        "| target | workers | workload | req/s | p50 ms | p99 ms | errors | server CPU % "
        "| peak RSS sum MiB | peak RSS largest proc MiB | peak PSS sum MiB | procs | start s |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r.wrk is None:
            reason = r.error.splitlines()[0][:120] if r.error else "no result"
            out.append(
                f"| {r.target} | {r.workers} | {r.workload} | — | — | — | {reason} | | | | | | |"
            )
            continue
        errs = str(r.wrk.errors) + (f" ({r.error})" if r.error else "")
        rps = _fmt(r.wrk.rps, 0)
        if len(r.rps_runs) > 1:
            rps += f" ({_fmt(min(r.rps_runs), 0)}..{_fmt(max(r.rps_runs), 0)})"
        out.append(
            f"| {r.target} | {r.workers} | {r.workload} | {rps} "
            f"| {_fmt(r.wrk.p50_ms)} | {_fmt(r.wrk.p99_ms)} | {errs} | {_fmt(r.cpu_pct, 0)} "
            f"| {_fmt(r.peak_sum_mib, 1)} | {_fmt(r.peak_single_mib, 1)} "
            f"| {_fmt(r.peak_pss_mib, 1)} | {r.procs} "
            f"| {_fmt(r.ready_s)} |"
        )
    out += _ratios(rows)
    out += _beside(rows, options.pin)
    if uploads:
        out += _uploads(options, uploads)
    return "\n".join(out) + "\n"


def _ratios(rows: list[Row]) -> list[str]:
    by_key = {(r.target, r.workers, r.workload): r for r in rows}
    lines = []
    for r in rows:
        bare = by_key.get(("bare", r.workers, r.workload))
        if r.target == "bare" or not (bare and bare.wrk and r.wrk):
            continue
        checks = ratio_checks(bare, r) if r.target == "runtime" else []
        if r.target == "runtime" and r.workers == 1:
            checks.append(start_check(r))
        lines.append(
            f"| {r.target} | {r.workers} | {r.workload} | {r.wrk.rps / bare.wrk.rps:.2f} "
            f"| {r.wrk.p99_ms / bare.wrk.p99_ms:.2f} "
            f"| {r.peak_sum_mib / bare.peak_sum_mib if bare.peak_sum_mib else 0:.2f} "
            f"| {r.peak_pss_mib / bare.peak_pss_mib if bare.peak_pss_mib else 0:.2f} "
            f"| {'; '.join(map(str, checks))} |"
        )
    if not lines:
        return []
    return [
        "",
        "Against the bare app on asyncio (req/s: higher is better; p99, RSS and PSS: lower is "
        "better; the memory target is on PSS, which counts a page shared by processes once, "
        "RSS is shown beside it):",
        "",
        "| target | workers | workload | req/s ratio | p99 ratio | RSS ratio | PSS ratio "
        "| targets |",
        "|---|---:|---|---:|---:|---:|---:|---|",
        *lines,
    ]


def _beside(rows: list[Row], pin: str) -> list[str]:
    """The runtime against the bare app on uvloop (the loop it runs on as installed), and
    tracing's cost (every request traced, against none).

    The target, at least as fast, is issue 31's: small JSON, the servers and wrk sharing the
    machine's cores, as the issue measured it. A pinned row gives the runtime's front and its
    worker the one core the bare app has alone: its ratio is shown, for what the second
    process costs, without a target."""
    by_key = {(r.target, r.workers, r.workload): r for r in rows}
    lines = []
    for r in rows:
        if r.target != "runtime" or r.wrk is None:
            continue
        uvloop = by_key.get(("bare-uvloop", r.workers, r.workload))
        if uvloop is not None and uvloop.wrk is not None:
            if split_cores(pin, r.workers):
                note = "pinned: front and worker on the bare app's one core"
            elif r.workload == "small_json":
                met = r.wrk.rps >= uvloop.wrk.rps
                note = f"at least 1.00: {'PASS' if met else 'FAIL'}"
            else:
                note = ""
            lines.append(_pair(r, uvloop, note))
        for name in ("runtime-traced", "runtime-sampled"):
            traced = by_key.get((name, r.workers, r.workload))
            if traced is not None and traced.wrk is not None:
                lines.append(_pair(traced, r, "tracing's cost"))
        baseline = by_key.get(("runtime-baseline", r.workers, r.workload))
        if baseline is not None and baseline.wrk is not None:
            rss = r.peak_sum_mib / baseline.peak_sum_mib if baseline.peak_sum_mib else 0
            lines.append(_pair(r, baseline, f"the change (RSS ratio {rss:.2f})"))
    if not lines:
        return []
    return [
        "",
        "The runtime against the bare app on uvloop (the runtime runs on uvloop as installed), "
        "and tracing's cost (runtime-traced: every request traced, sent over OTLP/HTTP to a "
        "sink that keeps nothing, in the same run; runtime-sampled: one in ten; a small "
        "request makes three spans: the server span, its queue wait and the handler's; "
        "runtime-baseline: the runtime as of --baseline-ref, in the same run):",
        "",
        "| target | against | workers | workload | req/s ratio | p99 ratio | |",
        "|---|---|---:|---|---:|---:|---|",
        *lines,
    ]


def _pair(row: Row, against: Row, note: str) -> str:
    assert row.wrk is not None and against.wrk is not None
    return (
        f"| {row.target} | {against.target} | {row.workers} | {row.workload} "
        f"| {row.wrk.rps / against.wrk.rps:.2f} | {row.wrk.p99_ms / against.wrk.p99_ms:.2f} "
        f"| {note} |"
    )


def _uploads(options: Options, uploads: list[UploadRow]) -> list[str]:
    out = [
        "",
        f"Streamed upload of {options.upload_mib} MiB to one worker (1 MiB client writes; "
        "growth = peak RSS during the upload minus RSS after a 4 MiB warm-up upload; "
        "'worker' = the process whose RSS grew most):",
        "",
        "| target | mode | returned size | seconds | MiB/s | worker RSS before MiB "
        "| worker RSS peak MiB | worker growth MiB | tree growth MiB | target |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for u in uploads:
        if u.error and u.size is None:
            out.append(f"| {u.target} | {u.mode} | {u.error.splitlines()[0][:120]} |" + " |" * 7)
            continue
        rate = options.upload_mib / u.seconds if u.seconds else 0.0
        verdict = str(upload_check(u))
        out.append(
            f"| {u.target} | {u.mode} | {u.size}{' ' + u.error if u.error else ''} "
            f"| {_fmt(u.seconds)} | {_fmt(rate, 0)} | {_fmt(u.worker_before_mib, 1)} "
            f"| {_fmt(u.worker_peak_mib, 1)} | {_fmt(u.worker_growth_mib, 1)} "
            f"| {_fmt(u.tree_growth_mib, 1)} | {verdict if u.target == 'runtime' else ''} |"
        )
    return out


RESULTS_HEADER = """\
# Benchmark results

Generated by `python -m benchmarks --write-results`; see benchmarks/README.md for what the
workloads are and how to read the columns. wrk and the server share the same 2 cores, so
absolute numbers understate a dedicated server; compare runtime to bare within one run.

"""


def write_results(report: str, append: bool) -> None:
    """Rewrite RESULTS.md with this run (or append it under the earlier runs)."""
    if append and RESULTS.exists():
        previous = RESULTS.read_text().rstrip("\n")
        RESULTS.write_text(previous + "\n\n" + report)
    else:
        RESULTS.write_text(RESULTS_HEADER + report)
