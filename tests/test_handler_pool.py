"""The handler pool (``front/pool.py``) through a real server: several workers, crashed and stuck
workers (contract A1).

The ``sv_pid`` handler answers with the pid of the worker that ran it, so every answer says which
process served it; ``?exit=1`` kills that process the way a segfault would, ``?hang=S`` holds it.
"""

from __future__ import annotations

import os
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers.servers import TIMED_OUT_AFTER_1_S, ServerFactory, call_all
from helpers.waiting import wait_until
from helpers.workers import alive, comm, crash_a_worker, pid_of, wait_for_ready_workers


def test_one_worker_means_two_processes_and_no_helper(start):
    """No process the service does not need: no multiprocessing resource tracker, no fork
    server; with ``--preload off`` the worker is a fresh interpreter running
    abeja_runtime.worker."""
    server = start("sv_pid", "--preload", "off")
    (worker,) = wait_for_ready_workers(server, 1)

    assert children_of(server.process.pid) == [worker]
    assert children_of(worker) == []
    assert b"abeja_runtime.worker" in Path(f"/proc/{worker}/cmdline").read_bytes()


def test_preloaded_one_worker_means_a_template_and_a_worker(start):
    """With ``--preload`` (the default) the template the worker was forked from is the one
    more process; the worker is the front's child, as a fresh one is."""
    server = start("sv_pid")
    (worker,) = wait_for_ready_workers(server, 1)

    children = children_of(server.process.pid)
    assert len(children) == 2 and worker in children
    (template,) = set(children) - {worker}
    assert children_of(worker) == [] and children_of(template) == []
    assert (comm(template), comm(worker)) == ("abeja-template", "abeja-worker")


def test_the_front_and_its_workers_do_not_preempt_one_another(start):
    """Both run under SCHED_BATCH (scheduling.py: measured, the front's work per 1 ms numpy
    request halves when it does not wake up cold after every answer)."""
    server = start("sv_pid")
    (worker,) = wait_for_ready_workers(server, 1)
    assert os.sched_getscheduler(server.process.pid) == os.SCHED_BATCH
    assert os.sched_getscheduler(worker) == os.SCHED_BATCH


def children_of(pid: int) -> list[int]:
    return [
        int(child)
        for task in Path(f"/proc/{pid}/task").iterdir()
        for child in (task / "children").read_text().split()
    ]


# --- several workers ---------------------------------------------------------------------------


def test_two_workers_serve_from_two_processes(start):
    server = start("sv_pid", "--workers", "2")
    workers = wait_for_ready_workers(server, 2)
    seen: set[int] = set()

    def both_served() -> bool:
        seen.update(pid_of(answer) for answer in call_all(server, ["/?hang=0.05"] * 4))
        return len(seen) == 2

    wait_until(both_served, 10, "answers from both workers")

    assert seen == set(workers)
    assert server.process.pid not in seen  # the supervisor itself never runs the handler


# --- a worker that dies ------------------------------------------------------------------------


def test_a_crashing_handler_loses_only_its_own_request(start):
    server = start("sv_pid")
    old = pid_of(server.request("GET", "/"))

    outcome = crash_a_worker(server)

    # The front answers for the dead worker when it sees it die, not at the call's deadline
    # (60 s by default, past the client's patience).
    assert outcome == 502, outcome
    record = server.wait_for_record(lambda r: "exited unexpectedly" in r.get("message", ""))
    assert record["message"] == (
        f"worker {old} exited unexpectedly (exit code 3); starting a replacement"
    )
    assert record["log_level"] == "error"
    server.wait_healthy(15)
    pids = {pid_of(server.request("GET", "/")) for _ in range(3)}
    assert len(pids) == 1
    assert old not in pids
    assert not alive(old)
    assert server.process.poll() is None


def test_other_workers_keep_serving_while_a_crashed_one_is_replaced(start):
    server = start("sv_pid", "--workers", "2")
    wait_for_ready_workers(server, 2)

    outcome = crash_a_worker(server)
    # No wait for the replacement: the other worker (or the kernel queue) takes these.
    answers = [server.request("GET", "/", timeout=10) for _ in range(6)]

    assert outcome == 502, outcome  # the front answers for the dead worker
    assert [answer.status for answer in answers] == [200] * 6
    assert server.health() == 200
    wait_for_ready_workers(server, 3)  # the replacement


# --- a worker whose handler is stuck -----------------------------------------------------------


def test_a_stuck_handler_gets_504_at_once_and_its_worker_recycled(start):
    server = start("sv_pid", "--timeout", "1", "--grace-period", "1")
    old = pid_of(server.request("GET", "/"))

    stuck = server.request("GET", "/?hang=30", timeout=30)

    # The deadline's answer, while the handler still runs: the recycling below ends the call
    # after timeout + grace, and a call ended that way would be answered 502 (its worker died),
    # one that ran to its end 200.
    assert stuck.status == 504
    assert stuck.json() == TIMED_OUT_AFTER_1_S
    noticed = server.wait_for_record(lambda r: "is killed and replaced" in r.get("message", ""))
    assert noticed["log_level"] == "error"
    recycled = server.wait_for_record(
        lambda r: r.get("message") == f"recycling worker {old}, whose handler is stuck"
    )
    assert recycled["log_level"] == "warning"
    server.wait_healthy(15)  # until the replacement is ready the service answers 503
    fresh = pid_of(server.request("GET", "/", timeout=10))
    assert fresh != old
    wait_until(lambda: not alive(old), 10, f"the stuck worker {old} to exit")
    assert server.health() == 200


# --- the supervisor itself ---------------------------------------------------------------------


def test_workers_exit_when_the_supervisor_is_killed(start):
    """A supervisor killed outright (SIGKILL, OOM) must not leave workers holding the port."""
    server = start("sv_pid", "--workers", "2")
    workers = wait_for_ready_workers(server, 2)
    try:
        server.process.kill()
        server.process.wait(10)

        wait_until(lambda: not any(map(alive, workers)), 10, f"workers {workers} to exit")
        with pytest.raises(ConnectionError):
            server.request("GET", "/", timeout=5)
    finally:
        for pid in filter(alive, workers):  # our own orphans, if the runtime left them
            os.kill(pid, signal.SIGKILL)


def test_max_requests_replaces_the_worker_without_failing_a_request(start: ServerFactory) -> None:
    server = start("sv_pid", "--max-requests", "10")
    pids: set[int] = set()

    def two_retired() -> bool:
        for answer in pool.map(lambda _: server.request("GET", "/"), range(8)):
            assert answer.status == 200, answer.body  # no request fails meanwhile
            pids.add(answer.json()["pid"])
        return len(pids) >= 3

    with ThreadPoolExecutor(4) as pool:  # load from 4 clients until two workers have retired
        wait_until(two_retired, 60, "two workers to retire")
    server.wait_for_record(lambda r: "has served" in r.get("message", ""))
    metrics = server.request("GET", "/metrics", port=server.healthcheck_port).body
    assert b'abeja_runtime_worker_restarts_total{reason="max_requests"}' in metrics
    assert b'abeja_runtime_worker_restarts_total{reason="crashed"} 0.0' in metrics


def test_a_worker_past_its_memory_limit_is_replaced_without_failing_a_request(
    start: ServerFactory,
) -> None:
    server = start("sv_pid", "--max-worker-memory", "150MiB")
    first = server.request("GET", "/").json()["pid"]
    for _ in range(4):  # 40 MB more each: past 150 MiB after a few
        assert server.request("GET", "/?leak=40").status == 200

    def replaced() -> int | None:
        answer = server.request("GET", "/")
        assert answer.status == 200, answer.body
        pid = answer.json()["pid"]
        return pid if pid != first else None

    wait_until(replaced, 20, "a fresh worker to serve")
    record = server.wait_for_record(lambda r: "--max-worker-memory" in r.get("message", ""))
    assert f"replacing worker {first}" in record["message"]


# --- the handler's own processes ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("how", "sig", "code"),
    [
        ("exec", "term", -signal.SIGTERM),
        ("exec", "int", -signal.SIGINT),
        ("fork", "term", -signal.SIGTERM),
        ("fork", "int", 1),  # KeyboardInterrupt, as in any Python program
    ],
)
def test_a_handler_s_children_stop_when_signalled(start, how: str, sig: str, code: int):
    """The worker leaves SIGTERM and SIGINT to the front, but its children do not inherit
    that: a handler's ``terminate()`` stops them (issue 28 point 5)."""
    server = start("sv_children")
    answer = server.request("GET", f"/?how={how}&sig={sig}", timeout=60)
    assert answer.status == 200, answer.body
    assert answer.json() == {"exit": code}


def test_a_worker_still_ignores_sigterm_and_sigint(start):
    """The front, not a signal, ends a worker: a Ctrl-C reaches the whole process group."""
    server = start("sv_pid")
    (worker,) = wait_for_ready_workers(server, 1)
    os.kill(worker, signal.SIGTERM)
    os.kill(worker, signal.SIGINT)
    assert pid_of(server.request("GET", "/")) == worker  # served after both signals
    assert alive(worker)


# --- a worker whose channel to the front breaks ------------------------------------------------


def test_bytes_a_handler_writes_to_the_channel_replace_its_worker_at_once(start):
    """Before, the front read a length from those bytes and waited for it until timeout +
    grace (issue 28 point 8)."""
    server = start("sv_channel")
    first = pid_of(server.request("GET", "/"))
    broken = server.request("GET", "/?write=1", timeout=30)
    assert broken.status == 502, broken.body
    record = server.wait_for_record(lambda r: "broke the protocol" in r.get("message", ""))
    assert f"worker {first} broke the protocol" in record["message"]
    assert "bytes that are not a frame" in record["message"]
    server.wait_healthy(15)
    assert pid_of(server.request("GET", "/")) != first
    assert not alive(first)


def test_a_worker_out_of_open_files_says_so_and_is_replaced(start):
    """Before, it exited with code 0 and no word when a body's descriptor could not be
    received."""
    server = start("sv_channel")
    first = pid_of(server.request("GET", "/?exhaust=1"))
    big = server.request("POST", "/", b"x" * (200 * 1024), timeout=30)
    assert big.status == 502, big.body
    said = server.wait_for_record(lambda r: "the worker stops" in r.get("message", ""))
    assert "descriptors sent with frames were lost" in said["message"]
    assert "ulimit -n is 256" in said["message"]
    exited = server.wait_for_record(lambda r: "exited unexpectedly" in r.get("message", ""))
    assert exited["message"].startswith(f"worker {first} exited unexpectedly (exit code 76)")
    server.wait_healthy(15)
    answer = server.request("POST", "/", b"x" * (200 * 1024))
    assert answer.json()["size"] == 200 * 1024 and pid_of(answer) != first


def test_with_concurrency_a_crash_fails_the_calls_running_in_that_worker(start):
    """What the README says holds: with ``--concurrency 4`` the four calls running in a worker
    that dies get 502, and the next call is served by its replacement (issue 28 point 11)."""
    server = start("sv_meet", "--concurrency", "4")
    (first,) = wait_for_ready_workers(server, 1)
    answers = call_all(server, ["/?meet=1"] * 3 + ["/?exit=1"], timeout=30)
    assert [answer.status for answer in answers] == [502] * 4, [a.body for a in answers]
    server.wait_healthy(15)
    assert pid_of(server.request("GET", "/")) != first
