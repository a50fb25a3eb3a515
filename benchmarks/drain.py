"""What replicas restarted in place behind haproxy cost clients, with and without a drain delay.

Three runtimes (``--workers 1``, a 5 ms handler) behind haproxy with its default settings: it
is given only what readiness needs (``option httpchk GET /health_check`` and a ``check port``
per server) and timeouts, so it checks every 2 s, marks a server DOWN after 3 failed checks and
UP after 2, and retries a request (3 times, on the same server) only when its connection is
refused. ``connections`` keep-alive clients send GET requests through it while each replica in
turn is stopped (SIGTERM), waited for, started again on the same ports once haproxy has it
DOWN, and waited for until haproxy has it UP again; ``rounds`` times. Every request that does
not get a 200 is a failure. The scenario runs with ``--drain-delay 0`` (the service port stops
accepting at the signal) and with the default delay, and prints answered and failed for each;
nothing is asserted (``tests/test_drain_haproxy.py`` checks that the default fails none).
Needs haproxy (``apt-get install haproxy``); sends traffic to 127.0.0.1 only; every wait is
bounded.

    python -m benchmarks.drain                      # the working tree, one round
    python -m benchmarks.drain --rounds 3           # each replica restarted three times
    python -m benchmarks.drain --runtime-ref HEAD   # a commit, through git archive
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

from abeja_runtime.launch import RuntimeProcess, runtime_command
from benchmarks.balancer import HAPROXY, Balancer, Slot
from benchmarks.chaos import HANDLER_DIR, load
from benchmarks.servers import runtime_source

#: The longest any one step may take: a replica's start or stop (the default drain delay is
#: 8 s), haproxy seeing it DOWN or UP (three or two checks, 2 s apart).
STEP_TIMEOUT: Final = 60.0


def wait_for(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + STEP_TIMEOUT
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {STEP_TIMEOUT:g} s")
        time.sleep(0.05)


class Replicas:
    """The runtimes, one per slot, each started with ``flags`` and waited for until healthy."""

    def __init__(self, env: dict[str, str], flags: Sequence[str]) -> None:
        self._env = env
        self._flags = flags
        self.running: dict[str, RuntimeProcess] = {}

    def start(self, slot: Slot) -> None:
        ports = ["--port", str(slot.port), "--healthcheck-port", str(slot.health_port)]
        runtime = RuntimeProcess(
            runtime_command("--host", "127.0.0.1", *ports, "--workers", "1", *self._flags),
            cwd=HANDLER_DIR,
            env=self._env,
            on_line=lambda line: None,
        )
        runtime.port, runtime.healthcheck_port = slot.port, slot.health_port
        self.running[slot.name] = runtime
        runtime.wait_healthy(STEP_TIMEOUT)

    def stop(self, slot: Slot) -> None:
        """SIGTERM, and its exit: the drain delay, then the drain."""
        self.running.pop(slot.name).stop(STEP_TIMEOUT)

    def kill_all(self) -> None:
        for runtime in self.running.values():
            runtime.kill()
        self.running.clear()


def restart_in_place(
    env: dict[str, str], flags: Sequence[str], connections: int, rounds: int
) -> dict[str, int]:
    """The scenario (see the module): the load's outcomes, counted by kind (``ok``, ``status
    503``, an exception's name)."""
    slots = [Slot(f"r{i}") for i in range(3)]
    replicas = Replicas(env, flags)
    counts: dict[str, int] = {}
    lock = threading.Lock()
    stop = threading.Event()
    clients: list[threading.Thread] = []
    with tempfile.TemporaryDirectory(prefix="abeja-drain-") as directory:
        balancer: Balancer | None = None
        try:
            for slot in slots:  # ready before haproxy's first checks
                replicas.start(slot)
            haproxy = balancer = Balancer(Path(directory), slots, tuned=False)
            wait_for(lambda: haproxy.up() == {s.name for s in slots}, "three UP")
            clients = [
                threading.Thread(target=load, args=(haproxy.port, stop, counts, lock))
                for _ in range(connections)
            ]
            for client in clients:
                client.start()
            for _ in range(rounds):
                for slot in slots:
                    restart(replicas, haproxy, slot)
        finally:
            stop.set()
            for client in clients:
                client.join(30)
            replicas.kill_all()
            if balancer is not None:
                balancer.stop()
    return counts


def restart(replicas: Replicas, haproxy: Balancer, slot: Slot) -> None:
    """Stop the replica, start it again on its ports once haproxy has it DOWN (it would send to
    a port that answers ``503`` while the replica starts), and wait until it has it UP."""
    replicas.stop(slot)
    wait_for(lambda: slot.name not in haproxy.up(), f"{slot.name} DOWN")
    replicas.start(slot)
    wait_for(lambda: slot.name in haproxy.up(), f"{slot.name} UP")


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.drain", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--runtime-ref", default="", help="git commit to run (default: tree)")
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=1, help="restarts of each replica")
    args = parser.parse_args()
    if not Path(HAPROXY).is_file():
        parser.error(f"haproxy is not installed at {HAPROXY} (apt-get install haproxy)")
    with tempfile.TemporaryDirectory(prefix="abeja-drain-src-") as tmp:
        source, _ = runtime_source(args.runtime_ref, Path(tmp))
        env = {**os.environ, "PYTHONPATH": str(source), "LOG_LEVEL": "error"}
        env.pop("ABEJA_RUNTIME_DRAIN_DELAY", None)  # the flag, or the default
        label = args.runtime_ref or "working tree"
        for flags, delay in ((["--drain-delay", "0"], "--drain-delay 0"), ([], "default delay")):
            counts = restart_in_place(env, flags, args.connections, args.rounds)
            failures = sum(n for key, n in counts.items() if key != "ok")
            print(
                f"{label}, {delay}: {counts.get('ok', 0)} answered, {failures} failed; "
                f"{dict(sorted(counts.items()))}",
                flush=True,
            )


if __name__ == "__main__":
    main()
