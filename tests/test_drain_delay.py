"""The drain delay (issue 31 point 4): after SIGTERM readiness says 503 at once, but for
``--drain-delay`` seconds every request is still answered, with ``Connection: close``, on
connections open before the signal and on new ones, on each way in; then the service port stops
accepting and the drain goes on as before. SIGINT never waits.

A balancer learns of the stop from readiness only, seconds later: a port that stopped accepting
at once (or an idle keep-alive connection closed at once) failed what it sent meanwhile. The
checks made "during" the delay use a 60 s one, ended by a second signal, so that a slow machine
cannot make them late; the end of a delay is seen in the log, not timed.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.grpc_calls import ASYNC_MODEL, with_grpc
from helpers.servers import RunningServer, ServerFactory
from helpers.waiting import wait_until

#: Longer than any check made during it: a second signal ends it.
LONG_DELAY = "60"
BODY = {"drain": 1}


def post(connection: http.client.HTTPConnection, *, chunked: bool = False) -> tuple[int, str]:
    """POST the JSON body on ``connection`` (chunked: aiohttp's path; else the direct path):
    the status and the ``Connection`` header; the echo must be the body."""
    data = json.dumps(BODY).encode()
    headers = {"Content-Type": "application/json"}
    if chunked:
        connection.request("POST", "/", iter([data]), headers, encode_chunked=True)
    else:
        connection.request("POST", "/", data, headers)
    answer = connection.getresponse()
    body = answer.read()
    assert answer.status != 200 or json.loads(body)["echo"] == BODY, body
    return answer.status, answer.getheader("Connection", "")


def connect(port: int) -> http.client.HTTPConnection:
    return http.client.HTTPConnection("127.0.0.1", port, timeout=20)


def said(server: RunningServer, words: str) -> dict:
    return server.wait_for_record(lambda r: words in r.get("message", ""))


def hold_call(server: RunningServer, release: Path) -> http.client.HTTPConnection:
    """A call that runs until ``release`` exists; its connection, to read the answer from."""
    held = connect(server.port)
    held.request("POST", f"/?until={release}", b"{}", {"Content-Type": "application/json"})
    wait_until(lambda: server.in_flight() == 1, 10, "the held call to run")
    return held


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


@pytest.fixture
def draining(
    make_server: ServerFactory,
) -> Iterator[tuple[RunningServer, http.client.HTTPConnection]]:
    """A runtime within a 60 s drain delay, and a keep-alive connection opened and used before
    its SIGTERM, idle since; a second SIGTERM stops it at once (exit 1) after the test."""
    server = make_server("fi_sync", "--drain-delay", LONG_DELAY)
    idle = connect(server.port)
    assert post(idle) == (200, "")  # kept alive
    server.process.send_signal(signal.SIGTERM)
    wait_until(lambda: server.health() == 503, 10, "readiness to say 503")
    try:
        yield server, idle
        assert server.process.poll() is None, "the runtime stopped within its drain delay"
    finally:
        idle.close()
        server.process.send_signal(signal.SIGTERM)
    assert server.wait_exit(20) == 1
    assert said(server, "second signal")["message"] == "second signal received; stopping at once"


def test_readiness_says_503_on_both_ports_and_the_log_says_why(draining):
    server, _ = draining
    assert server.health(server.port) == 503
    record = said(server, "received; shutting down gracefully")
    assert record["message"] == (
        "signal SIGTERM received; shutting down gracefully: readiness says 503 from now on, and "
        "requests are still answered for 60 s (--drain-delay), each with Connection: close, so "
        "that load balancers stop sending before the service port stops accepting"
    )


@pytest.mark.parametrize("chunked", [False, True], ids=["direct path", "aiohttp's path"])
def test_an_idle_keep_alive_connection_is_answered_then_closed(draining, chunked):
    _, idle = draining
    assert post(idle, chunked=chunked) == (200, "close")


@pytest.mark.parametrize("chunked", [False, True], ids=["direct path", "aiohttp's path"])
def test_a_new_connection_is_accepted_and_answered_then_closed(draining, chunked):
    server, _ = draining
    connection = connect(server.port)
    try:
        assert post(connection, chunked=chunked) == (200, "close")
    finally:
        connection.close()


def test_grpc_calls_are_served_during_the_delay(make_server):
    grpc = pytest.importorskip("grpc")
    pytest.importorskip("kserve", reason="the gRPC protocol is KServe's; tested with its package")
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
    from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc as stubs

    server = with_grpc(make_server, "st_kserve_async", "--drain-delay", LONG_DELAY, env=ASYNC_MODEL)
    said(server, "serving gRPC")
    server.process.send_signal(signal.SIGTERM)
    wait_until(lambda: server.health() == 503, 10, "readiness to say 503")
    tensor = pb.InferTensorContents(fp64_contents=[2.0])
    inputs = [
        pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP64", shape=[1], contents=tensor)
    ]
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        infer = stubs.GRPCInferenceServiceStub(channel).ModelInfer
        answer = infer(pb.ModelInferRequest(model_name="model", inputs=inputs), timeout=20)
    assert list(answer.outputs[0].contents.fp64_contents) == [4.0]  # doubled
    assert server.process.poll() is None, "the runtime stopped within its drain delay"
    assert server.stop(signal.SIGTERM, timeout=20) == 1


def test_after_the_delay_the_port_refuses_and_the_drain_goes_on(make_server, tmp_path: Path):
    """A call held past a 1 s delay keeps the runtime up after the port stopped accepting; it
    is answered, and the runtime exits 0."""
    server = make_server("fi_sync", env={"ABEJA_RUNTIME_DRAIN_DELAY": "1"})
    release = tmp_path / "release"
    held = hold_call(server, release)
    server.process.send_signal(signal.SIGTERM)
    record = said(server, "drain delay of 1 s over")
    assert record["message"] == (
        "drain delay of 1 s over: the service port stops accepting; 1 request(s) in flight, and "
        "any that arrive on connections still open, are answered within the grace period (30 s)"
    )
    assert refused(server.port)
    assert server.process.poll() is None, "the runtime exited before its call was answered"
    release.touch()
    answer = held.getresponse()
    assert (answer.status, answer.getheader("Connection")) == (200, "close")
    assert json.loads(answer.read())["echo"] == {}
    held.close()
    assert server.wait_exit(20) == 0


def test_sigint_stops_accepting_at_once(make_server, tmp_path: Path):
    server = make_server("fi_sync", "--drain-delay", LONG_DELAY)
    release = tmp_path / "release"
    held = hold_call(server, release)
    server.process.send_signal(signal.SIGINT)
    record = said(server, "the service port stops accepting")
    assert record["message"].startswith("the service port stops accepting; 1 request(s) in flight")
    assert refused(server.port)
    release.touch()
    assert held.getresponse().status == 200
    held.close()
    assert server.wait_exit(20) == 0
    assert not [r for r in server.records() if "--drain-delay" in r.get("message", "")]


def test_a_second_signal_within_the_delay_stops_at_once(make_server):
    server = make_server("fi_sync", "--drain-delay", LONG_DELAY)
    server.process.send_signal(signal.SIGTERM)
    wait_until(lambda: server.health() == 503, 10, "readiness to say 503")
    with contextlib.closing(connect(server.port)) as connection:
        assert post(connection) == (200, "close")  # within the delay, not stopped
    server.process.send_signal(signal.SIGINT)
    assert server.wait_exit(20) == 1
    # The workers it killed are not replaced: the pool stops with them.
    replaced = [r for r in server.records() if "replacement" in str(r.get("message", ""))]
    assert not replaced, replaced
