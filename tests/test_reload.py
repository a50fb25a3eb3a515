"""A reload (SIGHUP): the new version of the handler replaces the old one worker by worker, with no
request refused or failed; a new version that cannot be loaded, or fails its warm-up, leaves the
old one serving (issue 39).

The ``rv_versions`` handler answers the version its import read from a file, so that every answer
says which version gave it.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading
from pathlib import Path

import pytest
from helpers.metrics import scrape, total
from helpers.servers import RunningServer, ServerFactory
from helpers.waiting import wait_until
from helpers.workers import wait_for_ready_workers

RELOADED = "reloaded: every worker serves the new version of the handler"


class Clients:
    """Keep-alive clients that ask without pause until stopped: every status and version."""

    def __init__(self, server: RunningServer, count: int) -> None:
        self.answers: list[tuple[int, str]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._ask, args=(server.port,), daemon=True)
            for _ in range(count)
        ]
        for thread in self._threads:
            thread.start()

    def _ask(self, port: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        while not self._stop.is_set():
            try:
                connection.request("POST", "/", b"{}", {"Content-Type": "application/json"})
                answer = connection.getresponse()
                body = answer.read()
                got = (answer.status, _version(body))
            except (OSError, http.client.HTTPException) as exc:
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                got = (0, type(exc).__name__)
            with self._lock:
                self.answers.append(got)
        connection.close()

    def count(self) -> int:
        with self._lock:
            return len(self.answers)

    def stop(self) -> list[tuple[int, str]]:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)
        return self.answers


def _version(body: bytes) -> str:
    """The version an answer names, or the answer itself when it names none."""
    try:
        return json.loads(body)["version"]
    except (ValueError, KeyError, TypeError):
        return f"no version in {body[:200]!r}"


def reloads(server: RunningServer, message: str) -> int:
    return sum(1 for record in server.records() if record.get("message") == message)


def version_now(server: RunningServer) -> str:
    return server.request("POST", "/", b"{}").json()["version"]


@pytest.mark.parametrize("preload", ["on", "off"])
def test_five_reloads_under_load_fail_no_request(
    start: ServerFactory, tmp_path: Path, preload: str
) -> None:
    version = tmp_path / "version"
    version.write_text("1")
    server = start(
        "rv_versions", "--workers", "2", "--preload", preload, env={"RV_VERSION": str(version)}
    )
    wait_for_ready_workers(server, 2)  # each has read its version before the test writes one
    clients = Clients(server, 8)
    try:
        for new in range(2, 7):
            version.write_text(str(new))
            before = clients.count()
            os.kill(server.process.pid, signal.SIGHUP)
            wait_until(lambda n=new: reloads(server, RELOADED) == n - 1, 60, f"reload {new}")
            assert version_now(server) == str(new)
            wait_until(lambda b=before: clients.count() > b + 20, 30, "answers during it")
    finally:
        answers = clients.stop()

    assert {status for status, _ in answers} == {200}, [a for a in answers if a[0] != 200][:5]
    assert {got for _, got in answers} <= {"1", "2", "3", "4", "5", "6"}
    assert answers[-1][1] == "6"
    samples = scrape(server)
    assert total(samples, "abeja_runtime_reloads_total", outcome="done") == 5
    assert total(samples, "abeja_runtime_worker_restarts_total", reason="reload") == 10


@pytest.mark.parametrize(
    ("preload", "bad", "said"),
    [
        ("on", "broken", "the new version could not be loaded: "),
        ("off", "broken", "a worker of the new version exited before it was ready (exit code 1)"),
        ("on", "cold", "a worker of the new version exited before it was ready (exit code 75)"),
    ],
    ids=["import-preload", "import-each-worker", "warm-up"],
)
def test_a_new_version_that_fails_leaves_the_old_one_serving(
    start: ServerFactory, tmp_path: Path, preload: str, bad: str, said: str
) -> None:
    version = tmp_path / "version"
    version.write_text("1")
    warm = tmp_path / "warm.json"
    warm.write_text('{"warm": true}')
    server = start(
        "rv_versions", "--workers", "2", "--preload", preload, "--warmup", str(warm),
        env={"RV_VERSION": str(version)},
    )  # fmt: skip
    wait_for_ready_workers(server, 2)  # each has read its version before the test writes one
    clients = Clients(server, 4)
    try:
        version.write_text(bad)
        os.kill(server.process.pid, signal.SIGHUP)
        failed = server.wait_for_record(
            lambda r: r.get("message", "").startswith("the reload failed"), 60
        )
        assert failed["log_level"] == "error"
        assert said in failed["message"]
        assert failed["message"].endswith("; the old version serves on")
        assert version_now(server) == "1"
        version.write_text("2")  # fixed: the next reload goes through
        os.kill(server.process.pid, signal.SIGHUP)
        wait_until(lambda: reloads(server, RELOADED) == 1, 60, "the fixed version's reload")
        assert version_now(server) == "2"
    finally:
        answers = clients.stop()

    assert {status for status, _ in answers} == {200}
    assert {got for _, got in answers} <= {"1", "2"}
    samples = scrape(server)
    assert total(samples, "abeja_runtime_reloads_total", outcome="failed") == 1
    assert total(samples, "abeja_runtime_reloads_total", outcome="done") == 1


def test_a_signal_during_a_reload_is_ignored_and_the_old_version_serves_while_it_loads(
    start: ServerFactory, tmp_path: Path
) -> None:
    version, gate = tmp_path / "version", tmp_path / "gate"
    version.write_text("1")
    server = start("rv_versions", env={"RV_VERSION": str(version), "RV_GATE": str(gate)})
    version.write_text("gated")
    os.kill(server.process.pid, signal.SIGHUP)
    server.wait_for_record(lambda r: r.get("message", "").startswith("reloading the handler"))
    os.kill(server.process.pid, signal.SIGHUP)
    ignored = server.wait_for_record(lambda r: "SIGHUP ignored" in r.get("message", ""))
    assert ignored["message"] == "SIGHUP ignored: a reload is under way"
    assert version_now(server) == "1"  # while the new version loads
    gate.touch()
    wait_until(lambda: reloads(server, RELOADED) == 1, 60, "the reload")
    assert version_now(server) == "gated"
