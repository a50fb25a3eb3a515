"""Three replicas of a production image behind a real haproxy, under steady load.

What a Kubernetes Deployment with a Service and an ingress does, shown on this machine with real
containers: a rolling restart (a new replica ready first, then SIGTERM to an old one, which
drains) loses no request; ``kill -9`` of a replica loses at most what was in flight on it and the
balancer routes around it; the replicas' ``/metrics`` count exactly the requests answered.
The figures are printed (run with ``-s``) and recorded in docs/deploying.md.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker.errors
import pytest
from helpers.cli import http_request
from helpers.load import LoadClient, Tally
from helpers.waiting import wait_until
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.balancer import HAPROXY, Balancer, Slot

pytestmark = pytest.mark.docker

CONNECTIONS = 6
PORT_TRIES = 5
LOAD_SECONDS = 4.0


class Replicas:
    """Containers of one image, each published on a slot's host ports."""

    def __init__(self, client: Any, image: str, balancer: Balancer) -> None:
        self._client = client
        self._image = image
        self._balancer = balancer
        self.running: dict[str, Any] = {}  # slot name → container

    def start(self, slot: Slot) -> Any:
        """A container published on ``slot``'s ports, or on new ones if another test's container
        took them since they were picked (the balancer is told)."""
        for _ in range(PORT_TRIES):
            labels = {"org.abeja-runtime.kind": "container", "org.abeja-runtime.test": "replicas"}
            container = self._client.containers.create(
                self._image,
                read_only=True,
                tmpfs={"/tmp": ""},
                ports={
                    "5000/tcp": ("127.0.0.1", slot.port),
                    "5001/tcp": ("127.0.0.1", slot.health_port),
                },
                environment={"ABEJA_RUNTIME_GRACE_PERIOD": "10"},
                labels=labels,
            )
            try:
                container.start()
            except docker.errors.APIError as exc:
                container.remove(force=True)
                if "already allocated" not in str(exc) and "already in use" not in str(exc):
                    raise
                self._balancer.repoint(slot)
                continue
            self.running[slot.name] = container
            return container
        raise AssertionError(f"no free ports for {slot.name} in {PORT_TRIES} tries")

    def requests_total(self, slot: Slot) -> float:
        status, body = http_request(f"http://127.0.0.1:{slot.health_port}/metrics", timeout=5)
        assert status == 200, body
        return sum(
            sample.value
            for family in text_string_to_metric_families(body.decode())
            for sample in family.samples
            if sample.name == "abeja_runtime_requests_total"
        )

    def remove_all(self) -> None:
        for container in self.running.values():
            container.remove(force=True)
        self.running.clear()


def report(phase: str, tally: Tally) -> None:
    print(
        f"\n[replicas] {phase}: {tally.answered} answered, {len(tally.failures)} failed, "
        f"p99 {tally.p99() * 1000:.1f} ms; failures: {tally.failures[:5]}"
    )


@pytest.fixture
def cluster(
    production_image: tuple[str, Path], docker_client: Any, tmp_path: Path
) -> Iterator[tuple[Replicas, Balancer, list[Slot]]]:
    if not Path(HAPROXY).is_file():
        pytest.skip(f"haproxy is not installed at {HAPROXY} (apt-get install haproxy)")
    tag, _project = production_image
    slots = [Slot(f"r{i}") for i in range(6)]  # three in use, three for surge replacements
    balancer = Balancer(tmp_path, slots)
    replicas = Replicas(docker_client, tag, balancer)
    try:
        for slot in slots[:3]:
            replicas.start(slot)
        wait_until(lambda: balancer.up() == {"r0", "r1", "r2"}, 60, "three replicas UP")
        yield replicas, balancer, slots
    finally:
        replicas.remove_all()
        balancer.stop()


def test_three_replicas_behind_haproxy(cluster: tuple[Replicas, Balancer, list[Slot]]) -> None:
    replicas, balancer, slots = cluster

    # c. Steady state: the replicas count exactly the requests the client saw answered.
    before = sum(replicas.requests_total(slot) for slot in slots[:3])
    load = LoadClient(balancer.port, connections=CONNECTIONS)
    time.sleep(LOAD_SECONDS)  # the length of the phase, not a synchronisation
    steady = load.stop()  # every request has its answer once stop() returns
    counted = sum(replicas.requests_total(slot) for slot in slots[:3]) - before
    report("steady", steady)

    # a. Rolling restart as maxSurge 1 / maxUnavailable 0: a new replica UP, then SIGTERM.
    load = LoadClient(balancer.port, connections=CONNECTIONS)
    try:
        for old, new in zip(slots[:3], slots[3:], strict=True):
            replicas.start(new)
            wait_until(lambda new=new: new.name in balancer.up(), 60, f"{new.name} UP")
            replicas.running.pop(old.name).stop(timeout=30)  # SIGTERM, drain, exit
            wait_until(lambda old=old: old.name not in balancer.up(), 10, f"{old.name} DOWN")
    finally:
        rolling = load.stop()
    report("rolling restart", rolling)

    # b. kill -9 of one replica: at most its in-flight requests fail, then it is routed around.
    load = LoadClient(balancer.port, connections=CONNECTIONS)
    try:
        time.sleep(1)  # load on all three before the kill
        replicas.running.pop(slots[3].name).kill()
        wait_until(lambda: slots[3].name not in balancer.up(), 10, "the killed replica DOWN")
    finally:
        killed = load.stop()
    report("kill -9", killed)
    load = LoadClient(balancer.port, connections=CONNECTIONS)
    time.sleep(LOAD_SECONDS)
    after_kill = load.stop()
    report("after kill -9", after_kill)

    assert steady.failures == [] and steady.answered > 0
    assert counted == steady.answered, (counted, steady.answered)
    assert rolling.failures == [], rolling.failures
    assert rolling.answered > 0
    assert len(killed.failures) <= CONNECTIONS, killed.failures
    assert after_kill.failures == [] and after_kill.answered > 0
