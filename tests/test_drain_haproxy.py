"""Three replicas behind haproxy with its default settings, each restarted in place under
keep-alive load, lose no request with the default drain delay (issue 31 point 4).

haproxy is configured only with what readiness needs (``option httpchk`` and a ``check port``
per server) and timeouts: it checks every 2 s, marks a server DOWN after 3 failed checks, and
retries a request only when its connection is refused, on the same server. So it goes on
sending to a replica for up to 6 s after its SIGTERM: a runtime that stopped accepting at once,
or closed its idle keep-alive connections, failed what came meanwhile. The replicas are local
runtime processes (``--workers 1``), started again on the same ports once stopped; their drain
delay is left to its default (the test suite's own ``0`` is removed from their environment).
``python -m benchmarks.drain`` measures the same with and without the delay.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.load import LoadClient
from helpers.servers import HANDLERS, runtime_env
from helpers.waiting import wait_until

from abeja_runtime.launch import RuntimeProcess, runtime_command
from benchmarks.balancer import HAPROXY, Balancer, Slot

CONNECTIONS = 4
#: The default drain delay (8 s) and a drain with nothing left, with room for a slow machine.
STOP_TIMEOUT = 40.0


class Replicas:
    """Runtimes of the echo handler, each on a slot's ports, with the default drain delay."""

    def __init__(self, tmp_path: Path) -> None:
        env = runtime_env(TMPDIR=str(tmp_path))
        del env["ABEJA_RUNTIME_DRAIN_DELAY"]  # the default's, as deployed
        self._env = env
        self.running: dict[str, RuntimeProcess] = {}

    def start(self, slot: Slot) -> None:
        ports = ["--port", str(slot.port), "--healthcheck-port", str(slot.health_port)]
        runtime = RuntimeProcess(
            runtime_command("--host", "127.0.0.1", *ports, "--workers", "1"),
            cwd=HANDLERS / "fi_sync",
            env=self._env,
            on_line=lambda line: None,
        )
        runtime.port, runtime.healthcheck_port = slot.port, slot.health_port
        self.running[slot.name] = runtime
        runtime.wait_healthy(30)

    def stop(self, slot: Slot) -> int:
        """SIGTERM, and its exit (bounded): the drain delay, then the drain."""
        runtime = self.running.pop(slot.name)
        runtime.popen.send_signal(signal.SIGTERM)
        code = runtime.popen.wait(STOP_TIMEOUT)
        runtime.kill()  # whatever of its group is left
        return code

    def kill_all(self) -> None:
        for runtime in self.running.values():
            runtime.kill()
        self.running.clear()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Replicas, Balancer, list[Slot]]]:
    if not Path(HAPROXY).is_file():
        pytest.skip(f"haproxy is not installed at {HAPROXY} (apt-get install haproxy)")
    slots = [Slot(f"r{i}") for i in range(3)]
    replicas = Replicas(tmp_path)
    balancer: Balancer | None = None
    try:
        for slot in slots:  # ready before haproxy's first checks
            replicas.start(slot)
        balancer = Balancer(tmp_path, slots, tuned=False)
        wait_until(lambda: balancer.up() == {"r0", "r1", "r2"}, 30, "three replicas UP")
        yield replicas, balancer, slots
    finally:
        replicas.kill_all()
        if balancer is not None:
            balancer.stop()


def test_replicas_restarted_in_place_lose_no_request(cluster) -> None:
    replicas, balancer, slots = cluster
    load = LoadClient(balancer.port, connections=CONNECTIONS, max_seconds=180)
    try:
        wait_until(lambda: load.peek().answered >= 100, 30, "the load to flow")
        for slot in slots:
            assert replicas.stop(slot) == 0
            wait_until(lambda slot=slot: slot.name not in balancer.up(), 30, f"{slot.name} DOWN")
            replicas.start(slot)
            wait_until(lambda slot=slot: slot.name in balancer.up(), 30, f"{slot.name} UP")
    finally:
        tally = load.stop()
    print(f"\n[drain] {tally.answered} answered, {len(tally.failures)} failed")
    assert tally.failures == [], tally.failures[:10]
    assert tally.answered > 0
