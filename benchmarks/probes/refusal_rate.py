"""Probe: how many refusals a second the front makes on one core, against bare aiohttp's.

    python -m benchmarks.probes.refusal_rate [--runs 5] [--seconds 8] [--connections 256]

wrk floods, closed-loop, with far more connections than the queue takes (``--max-queue 64``, one
slot of a 5 ms handler), so that nearly every request is refused ``503``: by the runtime (with
``--tenant-header``, as in ``benchmarks.fairness``'s noisy scenario: the refusals of a tenant
at its share), and by the stand-in of ``cheap_refusal.py`` (aiohttp's low-level server, ``503``
from the parsed head). Each server is pinned to ``--server-cores``, wrk to ``--client-cores``,
the two alternated run by run; requests a second are printed per run and as the median.
Nothing is asserted.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import tempfile
from pathlib import Path

from benchmarks.probes.cheap_refusal import runtime_and_stand_in

_LUA = 'wrk.method = "POST"\nwrk.body = "{}"\nwrk.headers["Content-Type"] = "application/json"\n'


def flood(args: argparse.Namespace, port: int, script: Path) -> float:
    """Requests a second wrk got answered (nearly all of them refused)."""
    command = [
        "taskset", "-c", args.client_cores, "wrk", "-t1", f"-c{args.connections}",
        f"-d{args.seconds:g}s", "-H", "x-tenant: a", "-s", str(script),
        f"http://127.0.0.1:{port}/",
    ]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=args.seconds + 60, check=True
    )
    found = re.search(r"Requests/sec:\s+([\d.]+)", done.stdout)
    return float(found.group(1)) if found else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.probes.refusal_rate")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--connections", type=int, default=256)
    parser.add_argument("--server-cores", default="1")
    parser.add_argument("--client-cores", default="0")
    args = parser.parse_args()
    rates: dict[str, list[float]] = {"runtime": [], "bare aiohttp": []}
    with (
        tempfile.TemporaryDirectory(prefix="abeja-refusal-rate-") as tmp,
        runtime_and_stand_in(args.server_cores, Path(tmp)) as (runtime, port),
    ):
        script = Path(tmp) / "flood.lua"
        script.write_text(_LUA)
        for run in range(args.runs):
            for name, target in (("runtime", runtime.port), ("bare aiohttp", port)):
                rates[name].append(flood(args, target, script))
                print(f"run {run + 1}: {name} {rates[name][-1]:,.0f} requests/s", flush=True)
    for name, values in rates.items():
        print(f"{name}: median {statistics.median(values):,.0f} requests/s, runs {values}")


if __name__ == "__main__":
    main()
