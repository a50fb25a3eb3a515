"""Per-request cost of the runtime's Prometheus metrics, measured where it is paid.

A worker calls ``WorkerMetrics.observe(status, seconds)`` once per answered request (a counter
and a histogram in prometheus_client's multiprocess mode, i.e. memory-mapped file writes); the
gauges are sampled twice a second, not per request. This times that call, pinned to one core
like the server in the benchmark, and prints the median of several runs.

    taskset -c 1 python -m benchmarks.metrics_cost
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import timeit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000, help="calls per run")
    parser.add_argument("--runs", type=int, default=5, help="runs; the median is reported")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="abeja-metrics-bench-") as directory:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory  # before prometheus_client loads
        from abeja_runtime.metrics import WorkerMetrics

        metrics = WorkerMetrics()
        statuses = (200, 200, 200, 400, 200, 503, 200, 200)  # a few children, as in real life
        calls = iter(range(10**12))

        def one() -> None:
            metrics.observe(statuses[next(calls) % len(statuses)], 0.0012)

        per_call = [timeit.timeit(one, number=args.calls) / args.calls for _ in range(args.runs)]
    median = statistics.median(per_call) * 1e6
    spread = ", ".join(f"{t * 1e6:.2f}" for t in per_call)
    print(f"WorkerMetrics.observe: {median:.2f} us per request (median of {args.runs}: {spread})")


if __name__ == "__main__":
    main()
