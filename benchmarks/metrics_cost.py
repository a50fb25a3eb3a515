"""Per-request cost of the runtime's Prometheus metrics, measured where it is paid.

The front calls ``FrontMetrics.observe(status, seconds)`` once per answered request: plain
integers (a count per status code, a histogram bucket), made into metric families only when
``/metrics`` is scraped. This times that call, pinned to one core like the server in the
benchmark, and prints the median of several runs.

    taskset -c 1 python -m benchmarks.metrics_cost
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import timeit

from abeja_runtime.metrics import FrontMetrics


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000, help="calls per run")
    parser.add_argument("--runs", type=int, default=5, help="runs; the median is reported")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="abeja-metrics-bench-") as directory:
        metrics = FrontMetrics("bench", "main:handler", "abeja", directory, lambda: (0, 0))
        statuses = (200, 200, 200, 400, 200, 503, 200, 200)  # a few codes, as in real life
        calls = iter(range(10**12))

        def one() -> None:
            metrics.observe(statuses[next(calls) % len(statuses)], 0.0012)

        per_call = [timeit.timeit(one, number=args.calls) / args.calls for _ in range(args.runs)]
        assert b"abeja_runtime_requests_total" in metrics.render()
    median = statistics.median(per_call) * 1e6
    spread = ", ".join(f"{t * 1e6:.2f}" for t in per_call)
    print(f"FrontMetrics.observe: {median:.2f} us per request (median of {args.runs}: {spread})")


if __name__ == "__main__":
    main()
