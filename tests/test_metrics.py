"""``/metrics``, ``/livez`` and ``/health_check`` on the health-check port (the supervisor's).

Counts are read with prometheus_client's own parser, so the exposition is checked as Prometheus
reads it.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest
from helpers.metrics import scrape, total
from helpers.servers import RunningServer, ServerFactory
from helpers.waiting import wait_until
from helpers.workers import crash_a_worker, pid_of, wait_for_ready_workers


@pytest.fixture
def two_workers(make_server: ServerFactory) -> RunningServer:
    server = make_server("sv_pid", "--workers", "2")
    wait_for_ready_workers(server, 2)
    return server


def test_a_scrape_counts_exactly_the_requests_sent_to_two_workers(two_workers):
    server = two_workers
    pids = Counter(pid_of(server.request("GET", "/?hang=0.01")) for _ in range(40))
    for port in (server.port, server.healthcheck_port):
        assert server.request("GET", "/health_check", port=port).status == 200
    scrape(server)  # neither health checks nor scrapes are requests

    samples = scrape(server)

    assert len(pids) == 2, f"both workers should have served: {pids}"
    assert total(samples, "abeja_runtime_requests_total") == 40
    assert total(samples, "abeja_runtime_requests_total", code="200") == 40
    assert total(samples, "abeja_runtime_request_duration_seconds_count") == 40
    assert total(samples, "abeja_runtime_request_duration_seconds_sum") >= 40 * 0.01


def test_counts_survive_a_replaced_worker(two_workers):
    server = two_workers
    for _ in range(10):
        pid_of(server.request("GET", "/"))
    crash_a_worker(server)
    wait_for_ready_workers(server, 3)  # two, then the replacement
    for _ in range(10):
        pid_of(server.request("GET", "/"))

    samples = scrape(server)

    # The crashed request was answered 502 by the front and counted, as the dead worker's were.
    assert total(samples, "abeja_runtime_requests_total") == 21
    assert total(samples, "abeja_runtime_requests_total", code="502") == 1
    assert total(samples, "abeja_runtime_worker_restarts_total", reason="crashed") == 1
    assert total(samples, "abeja_runtime_worker_restarts_total", reason="stuck") == 0


def test_errors_timeouts_and_rejections_are_counted(make_server):
    server = make_server("sv_pid", "--timeout", "1", "--max-queue", "0")
    slow_answers: list[int] = []

    def slow_call() -> None:
        """Answered 504 after 1 s; its thread keeps the only slot for 2.5 s. Retried while a
        probe below holds the slot, so that exactly one slow call runs."""
        for _ in range(50):
            slow_answers.append(server.request("GET", "/?hang=2.5").status)
            if slow_answers[-1] != 503:
                return

    slow = threading.Thread(target=slow_call, daemon=True)
    slow.start()

    def rejected() -> bool:
        return server.request("GET", "/").status == 503

    wait_until(rejected, 5, "a request refused while the only slot is busy")
    slow.join(10)
    assert slow_answers[-1] == 504
    assert server.request("OPTIONS", "/").status == 405

    samples = scrape(server)
    assert total(samples, "abeja_runtime_timeouts_total") == 1
    assert total(samples, "abeja_runtime_requests_total", code="504") == 1
    assert total(samples, "abeja_runtime_rejected_requests_total", reason="busy") >= 1
    assert total(samples, "abeja_runtime_requests_total", code="503") >= 1
    assert total(samples, "abeja_runtime_requests_total", code="405") == 1


def test_in_flight_and_queued_gauges_follow_the_requests(make_server):
    server = make_server("sv_pid")
    callers = [
        threading.Thread(target=server.request, args=("GET", "/?hang=3"), daemon=True)
        for _ in range(2)
    ]
    for caller in callers:
        caller.start()

    def busy() -> Any:
        samples = scrape(server)
        running = total(samples, "abeja_runtime_in_flight_requests")
        queued = total(samples, "abeja_runtime_queued_requests")
        return (running, queued) if (running, queued) == (2, 1) else None

    assert wait_until(busy, 10, "2 requests in flight, 1 of them queued") == (2, 1)
    for caller in callers:
        caller.join(15)

    def idle() -> bool:
        samples = scrape(server)
        return total(samples, "abeja_runtime_in_flight_requests") == 0

    wait_until(idle, 5, "no request in flight")


def test_build_info_liveness_and_unknown_paths(make_server):
    server = make_server("ld_sync")
    samples = scrape(server)
    info = [labels for (name, labels), value in samples.items() if name.endswith("build_info")]
    assert len(info) == 1
    assert dict(info[0])["handler"] == "main:handler"
    live = server.request("GET", "/livez", port=server.healthcheck_port)
    assert (live.status, live.json()) == (200, {"status": "ok"})
    other = server.request("GET", "/predict", port=server.healthcheck_port)
    assert other.status == 404
    assert "/metrics" in other.json()["status"]
