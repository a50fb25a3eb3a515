"""Readiness and worker supervision under faults: the service never dies for a worker's sake.

Each test reproduces a fault an operator met (a slow second worker, a replacement killed while it
loads, replacements that keep dying, an ``async def`` handler that blocks its loop) with real
processes and sockets, and checks what the fault may and may not cost.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import threading
from pathlib import Path
from urllib.parse import quote

import pytest
from helpers.servers import Response, RunningServer
from helpers.waiting import wait_until
from helpers.workers import (
    alive,
    crash_a_worker,
    handler_processes,
    pid_of,
    ready_workers,
    wait_for_ready_workers,
)

#: The faults here are a worker's own import (slow, or killing it): each worker imports the
#: handler itself, as without --preload (``test_preload.py`` has the forked workers' faults).
OWN_IMPORTS = ("--preload", "off")
DIED = re.compile(r"worker (\d+) exited unexpectedly \((.+?)\); starting a replacement(.*)")


def children(pid: int) -> set[int]:
    """The supervisor's handler processes (its children but the template)."""
    return handler_processes(pid)


def deaths(server: RunningServer) -> list[tuple[int, str, str]]:
    return [
        (int(m.group(1)), m.group(2), m.group(3))
        for record in server.records()
        if (m := DIED.fullmatch(record.get("message", "")))
    ]


@pytest.fixture
def marker(tmp_path: Path) -> dict[str, str]:
    return {"RL_MARKER": str(tmp_path / "first-import-done")}


def test_ready_means_no_503_while_another_worker_loads(make_server, marker):
    server = make_server("rl_slow_replacements", "--workers", "2", *OWN_IMPORTS, env=marker)
    # Health said 200; the log line of that ready worker may still be on its way to us.
    assert len(wait_for_ready_workers(server, 1)) == 1, "the second worker should still be loading"

    statuses = [server.request("GET", "/").status for _ in range(60)]

    assert statuses == [200] * 60
    assert len(ready_workers(server)) == 1, "the test ran after the second worker was ready"


def test_a_replacement_killed_while_it_loads_is_replaced_again(make_server, marker):
    server = make_server(
        "rl_slow_replacements", "--workers", "2", *OWN_IMPORTS, env={**marker, "RL_SLOW": "3"}
    )
    first, second = wait_for_ready_workers(server, 2)

    os.kill(first, signal.SIGKILL)
    wait_until(lambda: deaths(server), 10, "the first death to be logged")
    replacement = wait_until(lambda: children(server.process.pid) - {second}, 5, "a replacement")
    (replacement,) = replacement
    os.kill(replacement, signal.SIGKILL)  # during its 3 s load
    answers = [server.request("GET", "/", timeout=10) for _ in range(10)]

    assert [pid_of(answer) for answer in answers] == [second] * 10
    assert server.health() == 200
    wait_until(lambda: len(deaths(server)) == 2, 10, "the second death to be logged")
    assert deaths(server) == [
        (first, "killed by SIGKILL", ""),
        (replacement, "killed by SIGKILL", ""),
    ]
    wait_for_ready_workers(server, 3)  # the second replacement loads and serves
    assert server.process.poll() is None


def test_replacements_that_keep_dying_back_off_and_answer_503(make_server, marker):
    server = make_server("rl_replacements_die", *OWN_IMPORTS, env=marker)
    crash = threading.Thread(target=crash_a_worker, args=(server,), daemon=True)
    crash.start()

    wait_until(lambda: len(deaths(server)) >= 4, 15, "four deaths in a row")
    found = deaths(server)
    delays = [when for _, _, when in found[:4]]

    assert found[0][1] == "exit code 3"  # the crash, then replacements dying at import
    assert {how for _, how, _ in found[1:4]} == {"exit code 9"}
    assert delays[0] == delays[1] == ""  # the first replacements start at once
    assert delays[2].startswith(" in 0.5 s") and delays[3].startswith(" in 1 s"), delays
    assert server.health() == 503
    assert server.request("GET", "/").status == 503  # an answer, never a hang
    assert server.request("GET", "/livez", port=server.healthcheck_port).status == 200
    assert server.process.poll() is None
    assert server.stop() == 0


def test_a_blocked_event_loop_is_killed_and_replaced_from_outside(make_server):
    server = make_server(
        "rl_async_block", "--workers", "2", "--timeout", "1", "--grace-period", "2"
    )
    workers = wait_for_ready_workers(server, 2)
    outcome: list[object] = []

    def blocked_call() -> None:
        try:  # its loop blocked for 60 s: only a kill from outside ends it sooner
            outcome.append(server.request("GET", "/?block=60", timeout=30).status)
        except ConnectionError as exc:
            outcome.append(type(exc).__name__)

    caller = threading.Thread(target=blocked_call, daemon=True)
    caller.start()
    blocked = server.wait_for_record(
        lambda r: "whose handler is stuck" in r.get("message", ""), timeout=30
    )
    # Meanwhile and after, the other worker serves and the health port answers.
    for _ in range(5):
        assert server.request("GET", "/", timeout=30).status == 200
        assert server.health() == 200
    caller.join(30)

    victim = int(blocked["message"].split()[2].rstrip(","))
    assert victim in workers
    judged = server.wait_for_record(lambda r: "this worker is killed" in r.get("message", ""))
    assert judged["message"] == (  # judged by the front at timeout + grace, not by the worker
        f"a handler call in worker {victim} has been running for more than 3 s (timeout 1 s + "
        "grace 2 s); this worker is killed and replaced"
    )
    assert outcome and outcome[0] != 200, outcome
    wait_until(lambda: not alive(victim), 30, "the blocked worker to be gone")  # 60 s: killed
    wait_for_ready_workers(server, 3)
    metrics = server.request("GET", "/metrics", port=server.healthcheck_port).body
    assert b'abeja_runtime_worker_restarts_total{reason="stuck"} 1.0' in metrics


def test_a_finished_response_survives_a_crash_right_after(make_server):
    """--workers 1: a 1 s call, and a crashing call queued behind it on another connection."""
    server = make_server("sv_pid")
    first: list[object] = []

    def slow() -> None:
        first.append(server.request("GET", "/?hang=1", timeout=20))

    caller = threading.Thread(target=slow, daemon=True)
    caller.start()
    wait_until(
        lambda: server.request("GET", "/metrics", port=server.healthcheck_port).body.count(
            b"abeja_runtime_in_flight_requests 1.0"
        ),
        5,
        "the slow call to run",
    )
    crashed = crash_a_worker(server)  # queued behind the slow call; exits once it runs
    caller.join(20)

    assert crashed == 502, crashed  # the front answers for the dead worker
    (answer,) = first
    assert isinstance(answer, Response) and answer.status == 200, answer
    server.wait_healthy(15)


@pytest.mark.parametrize("handler", ["fi_sync", "fi_async"])
def test_quick_calls_do_not_wait_behind_a_slow_one_while_another_worker_is_free(
    make_server, tmp_path, handler
):
    """Quick calls go to a worker that is already serving (waking another costs more than the
    call), and wait in its socket; a worker whose call turns out slow gives back the calls
    behind it: with a slow call running (until the test releases it), concurrent quick calls
    are all answered meanwhile, by the other worker."""
    server = make_server(handler, "--workers", "2")
    server.wait_healthy(15)

    def quick_calls(count: int) -> list[object]:
        answers: list[object] = []

        def call() -> None:
            answers.append(server.request("GET", "/", timeout=20))

        threads = [threading.Thread(target=call, daemon=True) for _ in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(20)
        return answers

    for _ in range(20):  # the front learns that calls are quick
        assert all(isinstance(a, Response) and a.status == 200 for a in quick_calls(8))
    slow_answer: list[object] = []
    release = tmp_path / "release"
    slow_path = f"/?until={quote(str(release))}"
    slow = threading.Thread(
        target=lambda: slow_answer.append(server.request("GET", slow_path, timeout=30)),
        daemon=True,
    )
    slow.start()
    try:
        wait_until(
            lambda: server.request("GET", "/metrics", port=server.healthcheck_port).body.count(
                b"abeja_runtime_in_flight_requests 1.0"
            ),
            10,
            "the slow call to run",
        )
        # The slow call ends only once released: a quick call waiting behind it would get no
        # answer (its client gives up after 20 s).
        answers = quick_calls(16)
        assert slow.is_alive(), "a quick call waited for the slow call to end"
    finally:
        release.touch()
    assert len(answers) == 16
    assert all(isinstance(a, Response) and a.status == 200 for a in answers), answers
    pids = {json.loads(a.body)["pid"] for a in answers if isinstance(a, Response)}
    slow.join(30)
    (slow_response,) = slow_answer
    assert isinstance(slow_response, Response) and slow_response.status == 200
    assert json.loads(slow_response.body)["pid"] not in pids


def test_a_worker_holding_every_connection_sheds_its_excess_once_another_is_ready(
    make_server, marker
):
    """Connections stay with the worker that accepted them: without rebalancing, the clients
    that reconnected to a crash's survivor would all be lost at its next crash."""
    server = make_server(
        "rl_slow_replacements", "--workers", "2", *OWN_IMPORTS, env={**marker, "RL_SLOW": "2"}
    )
    (first,) = wait_for_ready_workers(server, 1)  # the second is still loading
    clients = [http.client.HTTPConnection("127.0.0.1", server.port, timeout=10) for _ in range(8)]
    try:
        served_by = [ask(client) for client in clients]
        assert served_by == [first] * 8
        (second,) = set(wait_for_ready_workers(server, 2)) - {first}

        def spread() -> bool:
            served_by[:] = [ask(client) for client in clients]
            return served_by.count(second) >= 3

        wait_until(spread, 15, "connections moved to the second worker")
    finally:
        for client in clients:
            client.close()


def ask(client: http.client.HTTPConnection) -> int:
    """One request on a keep-alive connection (reopened if the server closed it): the pid."""
    client.request("GET", "/")
    answer = client.getresponse()
    body = answer.read()
    assert answer.status == 200, body
    pid: int = json.loads(body)["pid"]
    return pid


def test_a_worker_that_crashes_while_it_is_retired_is_replaced_once(make_server, marker):
    """--max-requests has a replacement starting when the retiring worker crashes: that
    replacement stands for it; starting one more would leave a worker too many for good."""
    server = make_server(
        "rl_slow_replacements", "--max-requests", "1", *OWN_IMPORTS, env={**marker, "RL_SLOW": "2"}
    )
    (first,) = wait_for_ready_workers(server, 1)
    assert server.request("GET", "/").status == 200  # its one request: a replacement loads 2 s
    wait_until(lambda: children(server.process.pid) - {first}, 5, "the replacement to start")
    with contextlib.suppress(OSError):  # the retiring worker dies, and this request with it
        server.request("GET", "/?exit=1")
    server.wait_for_record(lambda r: "its replacement is starting already" in r.get("message", ""))
    assert len(children(server.process.pid)) == 1, "a second replacement was started"
    wait_for_ready_workers(server, 2)
    assert server.request("GET", "/").status == 200
