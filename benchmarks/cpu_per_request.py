"""CPU time per small JSON request, in the front and in the worker, before and after a change.

Throughput on two shared cores varies by several percent from run to run; the CPU time each
process spends per request varies far less, so a change of a microsecond shows. Each variant
(the working tree, and ``--against`` commits exported with ``git archive``) serves the
small-JSON handler with one worker, unpinned; wrk sends ``--seconds`` of keep-alive load
after one second of warm-up, and the front's and the worker's CPU time (``/proc``) over the
measured seconds is divided by the requests wrk completed. Variants alternate, ``--rounds``
times; the medians are printed. Optional tracing: ``--otel all`` traces every request to an
OTLP sink (``otlp_sink.py``), ``--otel 0.1`` one in ten. Sends traffic to 127.0.0.1 only.

    python -m benchmarks.cpu_per_request --against 78fcf65            # tracing off, before/after
    python -m benchmarks.cpu_per_request --otel all --otel 0.1       # tracing's cost
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from abeja_runtime.launch import RuntimeProcess, free_ports, runtime_command
from benchmarks.load import run_wrk, wrk_script
from benchmarks.otlp_sink import otlp_sink
from benchmarks.processes import descendants, proc_table
from benchmarks.scenarios import WORKLOADS
from benchmarks.servers import HANDLERS, SERVER_ENV, runtime_source

_SMALL_JSON = WORKLOADS["small_json"]


def _cpu_seconds(pids: tuple[int, int]) -> tuple[float, float]:
    table = proc_table()
    ticks = os.sysconf("SC_CLK_TCK")
    return table[pids[0]].cpu_ticks / ticks, table[pids[1]].cpu_ticks / ticks


#: What ``ps -o comm`` calls the template (``--preload``), which serves no request.
_TEMPLATE = "abeja-template"


def _measure(source: Path, env: dict[str, str], seconds: float, script: Path) -> tuple[float, ...]:
    """(requests/s, front µs, worker µs) per request, for one server of ``source``."""
    port, health = free_ports(2)
    env = {**env, "PYTHONPATH": str(source)}
    command = runtime_command(
        "--host", "127.0.0.1", "--port", str(port), "--healthcheck-port", str(health),
        "--handler", "main:handler",
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/"
    with open(os.devnull, "wb") as log:
        server = RuntimeProcess(
            command, cwd=HANDLERS / _SMALL_JSON.handler_dir, env=env, output=log
        )
        server.port, server.healthcheck_port = port, health
        try:
            server.wait_healthy(60)
            front = server.popen.pid
            (worker,) = [  # (not the template, with --preload)
                pid
                for pid in descendants(front, proc_table())
                if pid != front and Path(f"/proc/{pid}/comm").read_text().strip() != _TEMPLATE
            ]
            run_wrk(url, script, duration=1, threads=1, connections=16)  # warm-up
            before = _cpu_seconds((front, worker))
            found = run_wrk(url, script, duration=seconds, threads=1, connections=16)
            after = _cpu_seconds((front, worker))
        finally:
            server.stop(30)
    return (
        found.rps,
        (after[0] - before[0]) / found.requests * 1e6,
        (after[1] - before[1]) / found.requests * 1e6,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.cpu_per_request", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--against", action="append", default=[], help="a commit to compare")
    parser.add_argument(
        "--otel", action="append", default=[], help="'all', or a ratio of requests to trace"
    )
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="abeja-cpu-") as tmp, otlp_sink() as endpoint:
        script = wrk_script(Path(tmp), _SMALL_JSON.name, _SMALL_JSON.content_type, _SMALL_JSON.body)
        base = {k: v for k, v in os.environ.items() if not k.startswith(("ABEJA_", "OTEL_"))}
        base.update(SERVER_ENV)
        variants: dict[str, tuple[Path, dict[str, str]]] = {}
        for ref in args.against:
            folder = Path(tmp) / ref
            folder.mkdir()
            variants[ref] = (runtime_source(ref, folder)[0], base)
        tree = runtime_source("", Path(tmp))[0]
        variants["working tree"] = (tree, base)
        for ratio in args.otel:
            traced = {**base, "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}
            if ratio != "all":
                traced["OTEL_TRACES_SAMPLER"] = "parentbased_traceidratio"
                traced["OTEL_TRACES_SAMPLER_ARG"] = ratio
            variants[f"traced ({ratio})"] = (tree, traced)
        found: dict[str, list[tuple[float, ...]]] = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, (source, env) in variants.items():
                found[name].append(_measure(source, env, args.seconds, script))
    print("| variant | req/s | front µs per request | worker µs per request |")
    print("|---|---:|---:|---:|")
    for name, runs in found.items():
        rate, front, worker = (statistics.median(column) for column in zip(*runs, strict=True))
        print(f"| {name} | {rate:,.0f} | {front:.1f} | {worker:.1f} |")


if __name__ == "__main__":
    main()
