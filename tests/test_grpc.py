"""KServe's Open Inference (V2) gRPC protocol on ``--grpc-port``, with real clients.

tritonclient's gRPC client runs in a process of its own (``clients/triton_grpc.py``): it and
kserve both register the protocol's ``.proto`` in protobuf's default pool. kserve's own
``InferenceGRPCClient`` and plain grpcio with kserve's stubs run here.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from helpers.grpc_calls import ASYNC_MODEL, varint, with_grpc
from helpers.servers import HANDLERS, KSERVE_CUSTOM, runtime_env
from helpers.waiting import wait_until
from helpers.workers import wait_for_ready_workers
from PIL import Image

from abeja_runtime.launch import free_port, runtime_command

pytest.importorskip("kserve", reason="the gRPC protocol is KServe's; tested with its package")
grpc = pytest.importorskip("grpc")
from kserve import InferenceGRPCClient, InferInput, InferRequest  # noqa: E402
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb  # noqa: E402
from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc as stubs  # noqa: E402

CLIENTS = Path(__file__).parent / "clients"
INFER = "/inference.GRPCInferenceService/ModelInfer"


def image_b64() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 100, 50)).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue())


def fp64(name: str, *values: float) -> pb.ModelInferRequest.InferInputTensor:
    return pb.ModelInferRequest.InferInputTensor(
        name=name,
        datatype="FP64",
        shape=[len(values)],
        contents=pb.InferTensorContents(fp64_contents=values),
    )


def infer(port: int, *inputs: Any, model: str = "model", **kwargs: Any) -> Any:
    """One ModelInfer call over a fresh channel: (response, call) or the grpc.RpcError."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        request = pb.ModelInferRequest(model_name=model, inputs=list(inputs))
        try:
            return stubs.GRPCInferenceServiceStub(channel).ModelInfer.with_call(
                request, timeout=20, **kwargs
            )
        except grpc.RpcError as exc:
            return exc


def running_call(server: Any, port: int, *inputs: Any) -> tuple[threading.Thread, list[Any]]:
    """A ModelInfer call on a thread of its own, once the worker has it in flight; its
    answer lands in the list."""
    answers: list[Any] = []

    def in_flight(count: int) -> bool:
        metrics = server.request("GET", "/metrics", port=server.healthcheck_port).body
        return f"abeja_runtime_in_flight_requests {count}.0".encode() in metrics

    # The gauge is sampled twice a second: a call that just ended may still show as 1.
    wait_until(lambda: in_flight(0), 10, "no call to be in flight")
    caller = threading.Thread(target=lambda: answers.append(infer(port, *inputs)))
    caller.start()
    wait_until(lambda: in_flight(1), 10, "the call to run")
    return caller, answers


@pytest.fixture(scope="module")
def asynchronous(make_module_server):
    return with_grpc(make_module_server, "st_kserve_async", env=ASYNC_MODEL)


@pytest.fixture(scope="module")
def grpc_port(asynchronous) -> int:
    return int(asynchronous.grpc_port)


@pytest.fixture(scope="module")
def custom(make_module_server):
    return with_grpc(
        make_module_server,
        KSERVE_CUSTOM,
        "--model-name",
        "custom-model",
        env={"HANDLER": "main"},
    )


def test_tritonclient_gets_kserve_answers_over_grpc(asynchronous, grpc_port):
    found = subprocess.run(
        [sys.executable, str(CLIENTS / "triton_grpc.py"), f"127.0.0.1:{grpc_port}", "model"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert found.returncode == 0, found.stderr
    answer = json.loads(found.stdout)
    assert (answer["live"], answer["ready"], answer["model_ready"]) == (True, True, True)
    assert answer["server_metadata"]["name"] == "kserve"
    assert answer["model_metadata"]["inputs"] == [
        {"name": "x", "datatype": "FP64", "shape": ["-1"]}
    ]
    # tritonclient sends raw_input_contents; kserve's InferRequest.from_grpc decodes them
    assert answer["doubled"] == [2.0, 5.0, -6.0]
    assert answer["response"]["model_name"] == "model"
    assert answer["unknown_model"]["status"] == "StatusCode.NOT_FOUND"
    assert "no-such-model" in answer["unknown_model"]["message"]
    assert answer["model_error"] == {
        "status": "StatusCode.INTERNAL",
        "message": "Internal server error",
    }


def test_kserve_grpc_client_runs_the_docs_custom_model_as_rest_does(custom):
    async def ask() -> Any:
        client = InferenceGRPCClient(url=f"127.0.0.1:{custom.grpc_port}", timeout=20)
        try:
            ready = await client.is_model_ready("custom-model")
            tensor = InferInput(name="input-0", shape=[1], datatype="BYTES", data=[image_b64()])
            request = InferRequest(model_name="custom-model", infer_inputs=[tensor])
            return ready, await client.infer(infer_request=request)
        finally:
            await client.close()

    ready, response = asyncio.run(ask())
    assert ready is True
    (output,) = response.outputs
    assert (output.name, output.shape, output.datatype) == ("output-0", [1, 5], "FP32")
    scores = output.as_numpy().flatten().tolist()

    body = {"inputs": [{"name": "input-0", "shape": [1], "datatype": "BYTES"}]}
    body["inputs"][0]["data"] = [image_b64().decode()]
    rest = custom.post_json(body, path="/v2/models/custom-model/infer")
    assert rest.status == 200, rest.body
    assert scores == pytest.approx(rest.json()["outputs"][0]["data"])


def test_a_grpc_call_is_logged_counted_and_tagged_with_its_request_id(asynchronous, grpc_port):
    response, call = infer(grpc_port, fp64("x", 4.0), metadata=[("x-abeja-request-id", "rq-42")])
    assert list(response.outputs[0].contents.fp64_contents) == [8.0]
    assert ("x-abeja-request-id", "rq-42") in tuple(call.trailing_metadata())

    record = asynchronous.wait_for_record(
        lambda r: r.get("log_type") == "access_log" and r.get("request_id") == "rq-42"
    )
    assert (record["http_method"], record["http_path"], record["http_status"]) == (
        "POST",
        INFER,
        200,
    )
    metrics = asynchronous.request("GET", "/metrics", port=asynchronous.healthcheck_port).body
    assert b'abeja_runtime_requests_total{code="200"}' in metrics


def test_bad_requests_get_kserve_status_codes(asynchronous, grpc_port):
    mismatched = pb.ModelInferRequest(
        model_name="model", inputs=[fp64("x", 1.0)], raw_input_contents=[b"\0" * 8, b"\0" * 8]
    )
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        with pytest.raises(grpc.RpcError) as refused:
            stubs.GRPCInferenceServiceStub(channel).ModelInfer(mismatched, timeout=20)
        with pytest.raises(grpc.RpcError) as unlisted:
            stubs.GRPCInferenceServiceStub(channel).RepositoryModelLoad(
                pb.RepositoryModelLoadRequest(model_name="model"), timeout=20
            )
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "does not match the expected number of raw input contents" in refused.value.details()
    assert unlisted.value.code() == grpc.StatusCode.UNIMPLEMENTED
    record = asynchronous.wait_for_record(
        lambda r: r.get("http_path") == INFER and r.get("http_status") == 400
    )
    assert record["log_type"] == "access_log"


def test_the_runtime_deadline_and_queue_apply_to_grpc_calls(make_server):
    server = with_grpc(
        make_server, "st_kserve_async", "--timeout", "3", "--max-queue", "0", env=ASYNC_MODEL
    )
    port = server.grpc_port
    late = infer(port, fp64("sleep", 30))
    assert late.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "handler timed out after 3 s" in late.details()
    # The call withdrawn at its deadline holds the worker's one slot until the worker has
    # stopped it (a few milliseconds, more on a loaded machine): a quick call answered shows
    # that the slot is free again.
    wait_until(
        lambda: not isinstance(infer(port, fp64("x", 1.0)), grpc.RpcError), 10, "a free slot"
    )
    refused_before = busy_refusals(server)

    caller, first = running_call(server, port, fp64("sleep", 2.5))
    busy = infer(port, fp64("x", 1.0))
    caller.join(20)
    assert busy.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert busy.details() == "service busy"
    (answered,) = first
    assert not isinstance(answered, grpc.RpcError), answered
    assert busy_refusals(server) == refused_before + 1


def busy_refusals(server: Any) -> float:
    """The runtime's count of calls refused as busy, from its metrics."""
    metrics = server.request("GET", "/metrics", port=server.healthcheck_port).body.decode()
    found = re.search(
        r'^abeja_runtime_rejected_requests_total\{reason="busy"\} (\S+)$', metrics, re.M
    )
    return float(found.group(1)) if found else 0.0


def test_two_workers_share_the_grpc_port_and_finish_calls_at_shutdown(make_server):
    server = with_grpc(make_server, "st_kserve_async", "--workers", "2", env=ASYNC_MODEL)
    port = server.grpc_port
    server.wait_for_record(lambda r: "serving gRPC" in r.get("message", ""))  # the front's
    wait_for_ready_workers(server, 2)
    caller, running = running_call(server, port, fp64("sleep", 3))
    assert server.stop(signal.SIGTERM) == 0
    caller.join(20)
    (answered,) = running
    assert not isinstance(answered, grpc.RpcError), answered
    response, _ = answered
    assert list(response.outputs[0].contents.fp64_contents) == [6.0]  # doubled


def start_and_fail(handler_dir: str, *flags: str, env: dict[str, str]) -> str:
    """Run a runtime that must not start: its exit code is 1; returns its output."""
    finished = subprocess.run(
        runtime_command("--host", "127.0.0.1", "--port", "0", "--healthcheck-port", "0", *flags),
        cwd=HANDLERS / handler_dir,
        env=runtime_env(**env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert finished.returncode == 1, finished
    return finished.stdout + finished.stderr


def test_a_style_without_grpc_refuses_the_grpc_port():
    output = start_and_fail("ld_sync", "--grpc-port", str(free_port()), env={})
    assert "--grpc-port serves the gRPC protocol of KServe (Open Inference) or of Seldon" in output
    assert "abeja style does not have" in output


def test_a_grpc_port_in_use_stops_the_start_with_a_clear_message():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        output = start_and_fail("st_kserve_async", "--grpc-port", str(port), env=ASYNC_MODEL)
    assert f"cannot listen for gRPC on 127.0.0.1:{port}" in output
    assert "choose another with --grpc-port" in output


@pytest.mark.parametrize("size", [1024 * 1024, 20 * 1024 * 1024])
def test_big_messages_travel_both_ways_through_shared_memory(make_server, size: int):
    """A message above 64 KiB goes to the handler process in a buffer that takes a body's
    place, and its answer comes back as a memfd: a Seldon binData round trip, byte-exact."""
    server = with_grpc(
        make_server, "st_seldon_identity", "--style", "seldon", env={"HANDLER": "MyModel"}
    )
    data = bytes(range(256)) * (size // 256)
    message = b"\x22" + varint(len(data)) + data  # SeldonMessage.binData (field 4)
    options = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}", options=options) as channel:
        predict = channel.unary_unary("/seldon.protos.Model/Predict")
        answers = [predict(message, timeout=60) for _ in range(3)]  # buffers reused
    for answer in answers:
        assert answer.endswith(data) and b"\x22" + varint(len(data)) in answer
