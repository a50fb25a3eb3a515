"""Preforked workers (``--preload``, issue 39): the memory N workers of a big model hold, and how
fast a killed worker is replaced.

    python -m benchmarks.preload                            # both, on the working tree
    python -m benchmarks.preload --mib 1024 --workers 8 --repeat 3 --kills 5

**Memory.** The ``weights`` handler holds an array of ``--mib`` MiB, written at import. The runtime
starts with one worker and ``--preload off`` (the reference: one worker, one copy), then with
``--workers N``, preload on and off; once every worker is ready, each process's PSS
(``/proc/PID/smaps_rollup``: a shared page counted once across the processes that share it) is
read. Printed: the sum, the front and the template, a worker, and the ratio to the reference.

**Reload.** Under load from ``--reload-connections`` keep-alive clients, the version file the
handler reads at import is changed and the runtime is sent SIGHUP, ``--reloads`` times, then
once with a version whose import fails: every answer's status and version, and whether the new
version answered after each reload (and the old one after the failed one).

**Replacement.** The handler's import takes ``--import-seconds``. Under load from
``--connections`` keep-alive clients, a worker is killed with SIGKILL, ``--kills`` times, a second
apart; the time
from the kill to its replacement's ``worker N is ready`` log line, and every request that was
not answered 200. Then once more with ``--preload off``, where a replacement imports again.

Sends traffic to 127.0.0.1 only; every wait is bounded; nothing is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import re
import signal
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from abeja_runtime.launch import RuntimeProcess, free_ports, runtime_command
from benchmarks.chaos import load
from benchmarks.processes import descendants, proc_table, pss_kib, rss_kib
from benchmarks.servers import runtime_source

HANDLER_DIR = Path(__file__).resolve().parent / "handlers" / "weights"
READY = re.compile(r"worker (\d+) is ready")
MIB = 1024


class Runtime:
    """A runtime serving the ``weights`` handler, and when each worker said it was ready."""

    def __init__(self, source: Path, workers: int, preload: bool, env: dict[str, str]) -> None:
        self.ready: dict[int, float] = {}
        self.reloads: list[str] = []
        self._changed = threading.Condition()
        port, health = free_ports(2)
        flags = ["--host", "127.0.0.1", "--port", str(port), "--healthcheck-port", str(health)]
        flags += ["--workers", str(workers), "--preload", "on" if preload else "off"]
        environment = {**os.environ, **env, "PYTHONPATH": str(source), "LOG_LEVEL": "info"}
        environment["ABEJA_RUNTIME_DRAIN_DELAY"] = "0"  # no balancer in front to wait for
        self.process = RuntimeProcess(
            runtime_command(*flags), cwd=HANDLER_DIR, env=environment, on_line=self._line
        )
        self.process.port, self.process.healthcheck_port = port, health

    def _line(self, line: str) -> None:
        with contextlib.suppress(ValueError, AttributeError):
            message = json.loads(line).get("message", "")
            match = READY.fullmatch(message)
            with self._changed:
                if match:
                    self.ready[int(match.group(1))] = time.monotonic()
                elif message.startswith(("reloaded:", "the reload failed")):
                    self.reloads.append(message)
                self._changed.notify_all()

    def wait_for_reloads(self, count: int, timeout: float) -> str:
        """The ``count``-th reload's outcome line (bounded by ``timeout``)."""
        with self._changed:
            if not self._changed.wait_for(lambda: len(self.reloads) >= count, timeout):
                raise TimeoutError(f"reload {count} did not end within {timeout:g} s")
            return self.reloads[count - 1]

    def wait_for_ready(self, count: int, timeout: float) -> list[int]:
        """The pids of the first ``count`` workers ready, in order (bounded by ``timeout``)."""
        with self._changed:
            if not self._changed.wait_for(lambda: len(self.ready) >= count, timeout):
                raise TimeoutError(f"{count} workers were not ready within {timeout:g} s")
            return list(self.ready)[:count]

    @property
    def pid(self) -> int:
        return self.process.popen.pid


@contextlib.contextmanager
def running(source: Path, workers: int, preload: bool, **env: str) -> Iterator[Runtime]:
    runtime = Runtime(source, workers, preload, env)
    try:
        yield runtime
    finally:
        runtime.process.stop(60)


def memory(source: Path, workers: int, preload: bool, mib: int) -> dict[str, float]:
    """PSS in MiB of the runtime's processes once ``workers`` are ready."""
    with running(source, workers, preload, WEIGHTS_MIB=str(mib)) as runtime:
        ready = set(runtime.wait_for_ready(workers, 600))
        tree = [pid for pid in descendants(runtime.pid, proc_table()) if pid != runtime.pid]
        pss = {pid: (pss_kib(pid) or 0) / MIB for pid in [runtime.pid, *tree]}
        rss = {pid: (rss_kib(pid) or 0) / MIB for pid in [runtime.pid, *tree]}
    others = [pid for pid in tree if pid not in ready]  # the template, with --preload
    return {
        "total": sum(pss.values()),
        "front": pss[runtime.pid],
        "template": sum(pss[pid] for pid in others),
        "worker": statistics.median(pss[pid] for pid in ready),
        "front+template RSS": rss[runtime.pid] + sum(rss[pid] for pid in others),
    }


def replacements(
    source: Path, preload: bool, kills: int, import_seconds: float, connections: int
) -> tuple[list[float], dict[str, int]]:
    """Seconds from each kill to its replacement's readiness, and the load's outcomes."""
    env = {"WEIGHTS_MIB": "64", "WEIGHTS_IMPORT_SECONDS": str(import_seconds)}
    timeout = 120 + 2 * import_seconds
    with running(source, 2, preload, **env) as runtime:
        runtime.wait_for_ready(2, timeout)
        stop, lock = threading.Event(), threading.Lock()
        counts: dict[str, int] = {}
        clients = [
            threading.Thread(target=load, args=(runtime.process.port, stop, counts, lock))
            for _ in range(connections)
        ]
        for client in clients:
            client.start()
        took = []
        try:
            for kill in range(kills):
                time.sleep(1.0)  # load between kills: the scenario's pace, not a synchronisation
                victim = list(runtime.ready)[-1]
                killed_at = time.monotonic()
                os.kill(victim, signal.SIGKILL)
                replacement = runtime.wait_for_ready(3 + kill, timeout)[-1]
                took.append(runtime.ready[replacement] - killed_at)
        finally:
            stop.set()
            for client in clients:
                client.join(60)
    return took, counts


def ask_versions(port: int, stop: threading.Event, seen: list[tuple[int, str]]) -> None:
    """A keep-alive client: each answer's status and version (``seen`` is shared)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    while not stop.is_set():
        try:
            connection.request("POST", "/", b"{}", {"Content-Type": "application/json"})
            answer = connection.getresponse()
            body = answer.read()
            got = (answer.status, json.loads(body).get("version", "") if body else "")
        except (OSError, http.client.HTTPException, ValueError) as exc:
            connection.close()
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            got = (0, type(exc).__name__)
        seen.append(got)
    connection.close()


@dataclass(frozen=True)
class Reloaded:
    """What the clients got through the reloads."""

    answered: int
    failed: int
    versions: list[str]
    #: The new version answered after each reload, and the old one after the failed one.
    each_as_it_should: bool


def reloads(source: Path, preload: bool, count: int, connections: int) -> Reloaded:
    """``count`` reloads under load, then one of a version that cannot be loaded."""
    with tempfile.TemporaryDirectory(prefix="abeja-reload-") as tmp:
        version = Path(tmp, "version")
        version.write_text("1")
        env = {"WEIGHTS_MIB": "64", "WEIGHTS_VERSION": str(version)}
        with running(source, 2, preload, **env) as runtime:
            runtime.wait_for_ready(2, 120)
            stop, seen = threading.Event(), list[tuple[int, str]]()
            port = runtime.process.port
            clients = [
                threading.Thread(target=ask_versions, args=(port, stop, seen))
                for _ in range(connections)
            ]
            for client in clients:
                client.start()
            newest_after_each: list[bool] = []
            try:
                for new in [*(str(n) for n in range(2, count + 2)), "broken"]:
                    time.sleep(1.0)  # load between reloads: the scenario's pace
                    version.write_text(new)
                    os.kill(runtime.pid, signal.SIGHUP)
                    outcome = runtime.wait_for_reloads(len(newest_after_each) + 1, 300)
                    expected = str(count + 1) if new == "broken" else new
                    probe = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                    probe.request("POST", "/", b"{}", {"Content-Type": "application/json"})
                    answered = json.loads(probe.getresponse().read()).get("version")
                    probe.close()
                    refused = outcome.startswith("the reload failed")
                    newest_after_each.append(answered == expected and refused == (new == "broken"))
            finally:
                stop.set()
                for client in clients:
                    client.join(60)
    return Reloaded(
        answered=len(seen),
        failed=sum(1 for status, _ in seen if status != 200),
        versions=sorted({got for status, got in seen if status == 200}, key=int),
        each_as_it_should=all(newest_after_each),
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.preload", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--runtime-ref", default="", help="git commit to run (default: tree)")
    parser.add_argument("--mib", type=int, default=1024, help="size of the model's array")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3, help="memory runs; the median is kept")
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--import-seconds", type=float, default=10.0)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--skip-replacement", action="store_true")
    parser.add_argument("--reloads", type=int, default=5)
    parser.add_argument("--reload-connections", type=int, default=64)
    parser.add_argument("--skip-reload", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="abeja-preload-") as tmp:
        source, described = runtime_source(args.runtime_ref, Path(tmp))
        print(f"runtime: {described}; {os.cpu_count()} cores")
        if not args.skip_memory:
            _print_memory(source, args)
        if not args.skip_replacement:
            _print_replacements(source, args)
        if not args.skip_reload:
            _print_reloads(source, args)


def _print_memory(source: Path, args: argparse.Namespace) -> None:
    runs = {
        "1 worker, --preload off": (1, False),
        f"{args.workers} workers, --preload on": (args.workers, True),
        f"{args.workers} workers, --preload off": (args.workers, False),
    }
    print(f"\nmemory, a {args.mib} MiB model, PSS in MiB (median of {args.repeat}):")
    print("| runtime | total | front | template | a worker | front+template RSS | vs 1 worker |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    reference = 0.0
    for name, (workers, preload) in runs.items():
        measured = [memory(source, workers, preload, args.mib) for _ in range(args.repeat)]
        row = {key: statistics.median(run[key] for run in measured) for key in measured[0]}
        reference = reference or row["total"]
        print(
            f"| {name} | {row['total']:,.0f} | {row['front']:,.0f} | {row['template']:,.0f} "
            f"| {row['worker']:,.0f} | {row['front+template RSS']:,.0f} "
            f"| {row['total'] / reference:.2f}x |"
        )


def _print_replacements(source: Path, args: argparse.Namespace) -> None:
    print(
        f"\nreplacement of a worker killed with SIGKILL under load ({args.connections} clients), "
        f"the handler's import taking {args.import_seconds:g} s:"
    )
    print("| runtime | kills | kill to ready, median s | max s | requests not 200 | answered |")
    print("|---|---:|---:|---:|---:|---:|")
    for preload, kills in ((True, args.kills), (False, 1)):
        took, counts = replacements(source, preload, kills, args.import_seconds, args.connections)
        failed = sum(n for key, n in counts.items() if key != "ok")
        print(
            f"| --preload {'on' if preload else 'off'} | {kills} "
            f"| {statistics.median(took):.3f} | {max(took):.3f} | {failed} "
            f"| {counts.get('ok', 0):,} |"
        )


def _print_reloads(source: Path, args: argparse.Namespace) -> None:
    print(
        f"\n{args.reloads} reloads (SIGHUP) under load from {args.reload_connections} clients, "
        "then one of a version that cannot be loaded; 2 workers:"
    )
    print("| runtime | answered | not 200 | versions answered | each reload's version served |")
    print("|---|---:|---:|---|---|")
    for preload in (True, False):
        found = reloads(source, preload, args.reloads, args.reload_connections)
        print(
            f"| --preload {'on' if preload else 'off'} | {found.answered:,} | {found.failed} "
            f"| {', '.join(found.versions)} | {found.each_as_it_should} |"
        )


if __name__ == "__main__":
    main()
