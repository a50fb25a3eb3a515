"""The caller's own deadline (``--deadline-header``, ``Request-Timeout``, gRPC's deadline): a
call is answered ``504`` once it passes, is never handed to a worker after it, and is refused
``503`` at once when the wait ahead is longer than what is left of it."""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from helpers.raw_http import events
from helpers.servers import Response, RunningServer, ServerFactory
from helpers.waiting import wait_until

SYNC = {"HANDLER": "main:handler"}


def started(server: RunningServer, tag: str) -> bool:
    """Whether the handler began the call tagged ``tag`` (ex_sleep prints its events)."""
    return bool(events(server, "start", tag))


def access_record(server: RunningServer, path_part: str) -> dict[str, Any]:
    """The access record of the request whose query tag is ``path_part`` (waited for)."""
    found: list[dict[str, Any]] = []

    def seen() -> bool:
        for line in server.lines:
            if '"http_status"' not in line:
                continue
            record = json.loads(line)
            if record.get("request_id") == path_part:
                found.append(record)
                return True
        return False

    wait_until(seen, 10, f"the access record of {path_part}")
    return found[0]


def call(
    server: RunningServer, tag: str, sleep: float, headers: dict[str, str]
) -> tuple[int, dict[str, Any], Any]:
    answer = server.request(
        "POST",
        f"/?tag={tag}&sleep={sleep}",
        b"{}",
        {"x-abeja-request-id": tag, **headers},
    )
    return answer.status, json.loads(answer.body), answer.headers


def in_background(server: RunningServer, path: str) -> Future[Response]:
    """A request sent from a thread of its own: its answer, when it comes."""
    pool = ThreadPoolExecutor(1)
    future = pool.submit(server.request, "POST", path, b"{}")
    pool.shutdown(wait=False)
    return future


@pytest.fixture
def one_slot(make_server: ServerFactory) -> RunningServer:
    return make_server("ex_sleep", "--workers", "1", "--concurrency", "1", env=SYNC)


@pytest.mark.parametrize(
    "headers",
    [{"Request-Timeout": "0.3"}, {"x-envoy-expected-rq-timeout-ms": "300"}],
    ids=["Request-Timeout in seconds", "Envoy's header in milliseconds"],
)
def test_a_call_past_its_callers_deadline_is_answered_504(
    one_slot: RunningServer, headers: dict[str, str]
) -> None:
    tag = "slow-" + next(iter(headers)).lower()
    status, body, _ = call(one_slot, tag, 3, headers)
    assert status == 504
    assert body["status"].startswith("no answer within the 0.3 s the caller's deadline gave")
    record = access_record(one_slot, tag)
    assert (record["http_status"], record["deadline"]) == (504, 0.3)


def test_a_deadline_beyond_the_timeout_is_capped_by_it(make_server: ServerFactory) -> None:
    server = make_server("ex_sleep", "--timeout", "0.4", env=SYNC)
    status, body, _ = call(server, "capped", 3, {"Request-Timeout": "30"})
    assert status == 504
    assert body["status"].startswith("handler timed out after 0.4 s")


def test_a_call_within_its_deadline_is_answered_and_its_record_says_it(
    one_slot: RunningServer,
) -> None:
    status, body, _ = call(one_slot, "in-time", 0, {"Request-Timeout": "20"})
    assert (status, body["tag"]) == (200, "in-time")
    assert access_record(one_slot, "in-time")["deadline"] == 20
    for index, value in enumerate(["soon", "inf", "nan", "-1", "9" * 400]):  # ignored
        tag = f"no-deadline-{index}"
        assert call(one_slot, tag, 0, {"Request-Timeout": value})[0] == 200, value
        assert "deadline" not in access_record(one_slot, tag), value


def test_a_queued_call_whose_deadline_passes_never_reaches_a_worker(
    one_slot: RunningServer, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    holder = in_background(one_slot, f"/?tag=holder&until={release}")
    wait_until(lambda: started(one_slot, "holder"), 30, "the first call to run")
    status, body, _ = call(one_slot, "late", 0, {"Request-Timeout": "0.3"})
    assert status == 504, body
    release.touch()
    assert holder.result(30).status == 200
    # The slot is free again: a call after it runs, and the late one never did.
    assert call(one_slot, "after", 0, {})[0] == 200
    wait_until(lambda: started(one_slot, "after"), 10, "the start line of the call after")
    assert not started(one_slot, "late")


def test_a_call_left_less_than_a_calls_time_when_its_turn_comes_is_never_started(
    one_slot: RunningServer, tmp_path: Path
) -> None:
    # Calls of 0.2, 0.2 and 1 s: a call takes about 0.4 s, but up to about 1.33 s (the mean
    # and four times its spread, call_time.py).
    for tag, sleep in [("short", 0.2), ("short-again", 0.2), ("long", 1.0)]:
        assert call(one_slot, tag, sleep, {})[0] == 200
    assert one_slot.queued() == 0  # (the metrics' first scrape, done before the timed part)
    release = tmp_path / "release"
    holder = in_background(one_slot, f"/?tag=holder&until={release}")
    wait_until(lambda: started(one_slot, "holder"), 30, "the first call to run")
    # Its expected wait (0.4 s) comes before its latest start (3 s less 1.33): admitted.
    sent = time.monotonic()
    hopeful = ThreadPoolExecutor(1).submit(call, one_slot, "hopeful", 0, {"Request-Timeout": "3"})
    wait_until(lambda: one_slot.queued() >= 1, 30, "the call to wait in the queue")
    # The slot frees after its latest start, before its deadline: its handler never starts.
    wait_until(lambda: time.monotonic() > sent + 2.1, 10, "its latest start to pass")
    release.touch()
    status, body, _ = hopeful.result(30)
    assert status == 504, body
    assert body["status"].startswith("the call's deadline was too near for its handler")
    assert access_record(one_slot, "hopeful")["refused"] == "deadline"
    assert holder.result(30).status == 200
    # The estimate refuses no call with time enough, nor one without a deadline.
    assert call(one_slot, "roomy", 0, {"Request-Timeout": "30"})[0] == 200
    assert call(one_slot, "after", 0, {})[0] == 200
    wait_until(lambda: started(one_slot, "after"), 10, "the start line of the call after")
    assert not started(one_slot, "hopeful")
    # With no call in the runtime and none answered for a second, the estimate refuses nothing:
    # a call with less time than it says a call may take goes, and measures the handler again.
    answered = time.monotonic()
    wait_until(lambda: time.monotonic() > answered + 1.2, 10, "a second with no answer")
    assert call(one_slot, "measures-again", 0, {"Request-Timeout": "1.0"})[0] == 200


def test_a_call_that_would_wait_past_its_deadline_is_refused_at_once(
    one_slot: RunningServer, tmp_path: Path
) -> None:
    assert call(one_slot, "measure", 1.0, {})[0] == 200  # a call's time: about 1 s
    release = tmp_path / "release"
    holder = in_background(one_slot, f"/?tag=holder&until={release}")
    wait_until(lambda: started(one_slot, "holder"), 30, "the first call to run")
    try:
        status, body, headers = call(one_slot, "hopeless", 0, {"Request-Timeout": "0.2"})
    finally:
        release.touch()
    assert status == 503
    assert body["status"].startswith("the wait for a worker and the call (about ")
    assert int(headers["Retry-After"]) >= 1
    assert holder.result(30).status == 200
    assert access_record(one_slot, "hopeless")["refused"] == "deadline"
    metrics = one_slot.request("GET", "/metrics", port=one_slot.healthcheck_port).body.decode()
    refused = re.search(r'rejected_requests_total\{reason="deadline"\} (\S+)', metrics)
    assert refused is not None and float(refused.group(1)) == 1.0
    assert not started(one_slot, "hopeless")


def test_the_deadline_header_is_a_setting(make_server: ServerFactory) -> None:
    server = make_server("ex_sleep", "--deadline-header", "x-budget", env=SYNC)
    assert call(server, "own-header", 3, {"x-budget": "0.3"})[0] == 504
    # Envoy's header is no longer read; Request-Timeout still is.
    assert call(server, "envoy", 0.5, {"x-envoy-expected-rq-timeout-ms": "100"})[0] == 200
    # (refused at once, 503, now that the front has seen a call take 3 s; else 504)
    assert call(server, "plain", 3, {"Request-Timeout": "0.3"})[0] in (503, 504)
    assert "deadline" in access_record(server, "plain")


def test_a_grpc_callers_deadline_refuses_a_call_that_would_wait_past_it(
    make_server: ServerFactory,
) -> None:
    grpc = pytest.importorskip("grpc")
    pytest.importorskip("kserve")
    from helpers.grpc_calls import ASYNC_MODEL, with_grpc
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
    from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc as stubs

    server = with_grpc(make_server, "st_kserve_async", "--concurrency", "1", env=ASYNC_MODEL)

    def infer(seconds: float, timeout: float) -> Any:
        tensor = pb.ModelInferRequest.InferInputTensor(
            name="sleep", datatype="FP64", shape=[1],
            contents=pb.InferTensorContents(fp64_contents=[seconds]),
        )  # fmt: skip
        with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            request = pb.ModelInferRequest(model_name="model", inputs=[tensor])
            try:
                return stubs.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=timeout)
            except grpc.RpcError as exc:
                return exc

    assert not isinstance(infer(1.0, 30), grpc.RpcError)  # a call's time: about 1 s
    pool = ThreadPoolExecutor(1)
    holder = pool.submit(infer, 3.0, 30)
    wait_until(lambda: server.in_flight() >= 1, 10, "the first call to run")
    refused = infer(0.0, 0.4)
    pool.shutdown(wait=True)
    assert not isinstance(holder.result(), grpc.RpcError)
    assert isinstance(refused, grpc.RpcError)
    assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused
    assert refused.details().startswith("the wait for a worker and the call (about ")
