"""Benchmark the ABEJA runtime against a bare aiohttp app, in one run, on this machine.

For every (workers, workload) pair the targets are run back to back, so slow drift in the
machine (thermal, noisy neighbours) hits every side alike. Each server is a fresh subprocess on
127.0.0.1 with free ports; it is always stopped before the next one starts, on every exit path.
Nothing is asserted: the report says PASS or FAIL per target, and the exit status is 1 only
when a measurement could not be taken.

Usage: python -m benchmarks [--duration 10] [--write-results]
"""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.otlp_sink import otlp_sink
from benchmarks.report import RESULTS, Options, machine_info, render, write_results
from benchmarks.scenarios import (
    WORKLOADS,
    LoadSpec,
    Row,
    UploadRow,
    UploadSpec,
    bench_one,
    bench_upload,
    median_row,
)
from benchmarks.servers import DEFAULT_TARGETS, REPO, TARGETS, Setup, runtime_source


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
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=10, help="seconds of measured wrk load")
    p.add_argument("--warmup", type=float, default=2, help="unrecorded wrk seconds first")
    p.add_argument(
        "--repeat", type=int, default=3, help="runs per row, interleaved; the median is kept"
    )
    p.add_argument("--threads", type=int, default=1, help="wrk -t")
    p.add_argument("--connections", type=int, default=16, help="wrk -c")
    p.add_argument(
        "--targets",
        type=_csv(str, set(TARGETS)),
        default=list(DEFAULT_TARGETS),
        help=f"comma-separated, of: {','.join(TARGETS)} (default: {','.join(DEFAULT_TARGETS)})",
    )
    p.add_argument("--workers", type=_csv(int), default=[1])
    p.add_argument("--workloads", type=_csv(str, set(WORKLOADS)), default=list(WORKLOADS))
    p.add_argument(
        "--pin",
        choices=["auto", "none", "split"],
        default="auto",
        help="split: taskset server to CPU 0 and wrk to CPU 1; auto: split only for 1 worker",
    )
    p.add_argument(
        "--runtime-ref",
        default="",
        help="benchmark abeja_runtime/ as of this git commit (exported to a temp dir) instead "
        "of the working tree, which other people may be editing mid-run",
    )
    p.add_argument(
        "--baseline-ref",
        default="",
        help="also measure abeja_runtime/ as of this git commit, as the target "
        "runtime-baseline, interleaved with the others: a change held against it in one run",
    )
    p.add_argument("--runtime-args", default="", help="extra runtime flags, e.g. '--loop asyncio'")
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
    p.add_argument(
        "--also",
        action="append",
        choices=("streams", "batching", "openai_streams", "fairness"),
        default=[],
        help="after the matrix, run this benchmark too, with its defaults (streams: time to "
        "first chunk and 1,000 SSE streams; batching: the fixed-cost model batched, beside Ray "
        "Serve and LitServe; openai_streams: the OpenAI style's chat streams beside LitServe's "
        "OpenAISpec; fairness: tenants, deadlines and priorities on a 5 ms handler), and print "
        "its table (written too with --write-results)",
    )
    args = p.parse_args(argv)
    if args.baseline_ref and "runtime-baseline" not in args.targets:
        args.targets.append("runtime-baseline")
    return args


def _raise_interrupt(signum: int, frame: object) -> None:
    """Turn SIGTERM into KeyboardInterrupt so every finally block stops its server."""
    raise KeyboardInterrupt


def _matrix(args: argparse.Namespace, load: LoadSpec, setup: Setup) -> list[Row]:
    """Each target on each (workers, workload), ``--repeat`` times: the median rows. Targets
    are interleaved per (workers, workload), so that drift hits every side alike."""
    rows: list[Row] = []
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
                    runs[target].append(bench_one(load, setup, target, workers, WORKLOADS[name]))
            rows += [median_row(runs[t]) for t in args.targets]
    return rows


def _uploads(args: argparse.Namespace, upload: UploadSpec, setup: Setup) -> list[UploadRow]:
    """The streamed upload, each mode on the bare app and the runtime."""
    rows = []
    for mode in args.upload_modes:
        for target in ("bare", "runtime"):
            print(f"- upload {args.upload_mib} MiB {target} {mode}", file=sys.stderr)
            rows.append(bench_upload(upload, setup, target, mode))
    return rows


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
    load = LoadSpec(args.duration, args.warmup, args.threads, args.connections, args.runtime_path)
    upload = UploadSpec(args.upload_mib, args.upload_timeout, shlex.split(args.upload_runtime_args))

    rows: list[Row]
    uploads: list[UploadRow] = []
    with tempfile.TemporaryDirectory(prefix="abeja-bench-") as tmp:
        try:
            src, src_desc = runtime_source(args.runtime_ref, Path(tmp) / "runtime")
            baseline = runtime_source(args.baseline_ref, Path(tmp) / "baseline")
        except (OSError, subprocess.SubprocessError) as e:
            print(f"cannot export abeja_runtime: {e}", file=sys.stderr)
            return 2
        info = machine_info(src_desc)
        if args.baseline_ref:
            info.append(("runtime-baseline source", baseline[1]))
        with otlp_sink() as otlp_endpoint:
            setup = Setup(
                runtime_src=src,
                runtime_src_desc=src_desc,
                runtime_args=shlex.split(args.runtime_args),
                pin=args.pin,
                ready_timeout=args.ready_timeout,
                stop_timeout=args.stop_timeout,
                tmp=Path(tmp),
                otlp_endpoint=otlp_endpoint,
                baseline_src=baseline[0] if args.baseline_ref else None,
            )
            rows = _matrix(args, load, setup)
        if not args.skip_upload:
            uploads = _uploads(args, upload, setup)

    info.insert(5, ("load average at end", " ".join(f"{x:.2f}" for x in os.getloadavg())))
    if args.note:
        info.append(("note", args.note))
    options = Options(
        command=["python", "-m", "benchmarks", *(argv if argv is not None else sys.argv[1:])],
        threads=args.threads,
        connections=args.connections,
        duration=args.duration,
        warmup=args.warmup,
        repeat=args.repeat,
        pin=args.pin,
        upload_mib=args.upload_mib,
    )
    report = render(options, rows, uploads, info)
    print(report)
    if args.write_results:
        write_results(report, args.append)
        print(f"wrote {RESULTS.relative_to(REPO)}", file=sys.stderr)
    failed = any(r.error for r in rows) or any(u.error for u in uploads)
    for name in args.also:  # each prints (and writes) its own table
        print(f"- {name}", file=sys.stderr, flush=True)
        also = importlib.import_module(f"benchmarks.{name}")
        failed = bool(also.main(["--write"] if args.write_results else [])) or failed
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
