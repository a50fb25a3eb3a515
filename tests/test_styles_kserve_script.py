"""KServe's main-script habit and transformers: ``abeja-runtime kserve model.py [KServe args]``.

The docs' custom model file is served unchanged from its ``__main__`` block, and a transformer
(``st_kserve_transformer``) reaches a second runtime, the predictor, over REST V1, REST V2 and
gRPC, as KServe's ``--predictor_host`` / ``--predictor_protocol`` say.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.client
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.grpc_calls import ASYNC_MODEL, with_grpc
from helpers.servers import HANDLERS, KSERVE_CUSTOM, runtime_env
from helpers.waiting import wait_until
from PIL import Image

from abeja_runtime.launch import free_port, free_ports, runtime_command

pytest.importorskip("kserve", reason="KServe's main-script habit is tested with its package")
from kserve import InferenceGRPCClient, InferInput, InferRequest

NAME = "tx"


def start_script(make_server, handler_dir: str | Path, script: str, *kserve_args: str, **env: str):
    """``abeja-runtime kserve SCRIPT --http_port P ...`` with the health port from the
    environment, as in a container; returns the server and its gRPC port."""
    http, health, grpc = free_ports(3)
    server = make_server(
        handler_dir,
        "--http_port",
        str(http),
        "--grpc_port",
        str(grpc),
        *kserve_args,
        subcommand=("kserve", script),
        ports=(http, health),
        env={"ABEJA_RUNTIME_HOST": "127.0.0.1", "HEALTHCHECK_PORT": str(health), **env},
    )
    server.grpc_port = grpc
    return server


def image_b64() -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 100, 50)).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def test_the_docs_model_file_serves_unchanged_from_its_main_block(make_server):
    server = start_script(
        make_server, KSERVE_CUSTOM, "main.py", "--model_name", "from-args", "--workers", "2"
    )
    answer = server.post_json(
        {"instances": [{"image": {"b64": image_b64()}}]}, path="/v1/models/from-args:predict"
    )
    assert answer.status == 200, answer.body
    assert len(answer.json()["predictions"]) == 5

    async def ask() -> Any:
        client = InferenceGRPCClient(url=f"127.0.0.1:{server.grpc_port}", timeout=20)
        try:
            return await client.is_model_ready("from-args")
        finally:
            await client.close()

    assert asyncio.run(ask()) is True
    started = server.wait_for_record(lambda r: "__main__ block starts" in r.get("message", ""))
    assert "AlexNetModel" in started["message"]
    server.wait_for_record(lambda r: "workers=2" in r.get("message", ""))


def test_grpc_can_be_switched_off_as_in_kserve(make_server):
    server = start_script(
        make_server, KSERVE_CUSTOM, "main.py", "--model_name", "m", "--enable_grpc", "false"
    )
    assert server.request("GET", "/v1/models/m").status == 200
    assert not any("serving gRPC" in r.get("message", "") for r in server.records())


def test_enable_docs_url_serves_the_swagger_ui_as_kserve_does(make_server, tmp_path):
    docs_on = ("--model_name", "m", "--enable_docs_url", "true")
    server = start_script(make_server, KSERVE_CUSTOM, "main.py", *docs_on)
    ours = server.request("GET", "/docs")
    folder = tmp_path / "model"
    shutil.copytree(KSERVE_CUSTOM, folder)
    port = free_port()
    command = [sys.executable, "main.py", "--model_name", "m", "--http_port", str(port),
               "--grpc_port", str(free_port()), "--enable_docs_url", "true"]  # fmt: skip
    kserve = subprocess.Popen(
        command, cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:

        def docs() -> tuple[int, bytes] | None:
            assert kserve.poll() is None, "KServe's ModelServer exited"
            with contextlib.suppress(OSError):
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                try:
                    connection.request("GET", "/docs")
                    answer = connection.getresponse()
                    return answer.status, answer.read()
                finally:
                    connection.close()
            return None

        theirs = wait_until(docs, 60, "KServe's ModelServer to serve /docs")
    finally:
        kserve.terminate()
        kserve.wait(15)
    assert (ours.status, ours.body) == theirs
    assert ours.headers["Content-Type"].startswith("text/html")
    assert b"swagger-ui" in ours.body and b"/openapi.json" in ours.body


@pytest.fixture(scope="module")
def predictor(make_module_server):
    return with_grpc(make_module_server, "st_kserve_async", "--model-name", NAME, env=ASYNC_MODEL)


def start_transformer(make_server, predictor_host: str, *more: str):
    """The transformer of st_kserve_transformer, forwarding to ``predictor_host``."""
    return start_script(
        make_server,
        "st_kserve_transformer",
        "transformer.py",
        "--model_name",
        NAME,
        "--predictor_host",
        predictor_host,
        *more,
    )


@pytest.mark.parametrize(
    ("protocol", "expected", "predictor_path"),
    [
        # The predictor's V1 answer is its input (the transformer's doubling); its V2 answer
        # doubles again.
        ("v1", [2.0, 5.0], f"/v1/models/{NAME}:predict"),
        ("v2", [4.0, 10.0], f"/v2/models/{NAME}/infer"),
        ("grpc-v2", [4.0, 10.0], "/inference.GRPCInferenceService/ModelInfer"),
    ],
)
def test_a_transformer_reaches_its_predictor(
    make_server, predictor, protocol, expected, predictor_path
):
    port = predictor.grpc_port if protocol == "grpc-v2" else predictor.port
    transformer = start_transformer(
        make_server, f"127.0.0.1:{port}", "--predictor_protocol", protocol
    )
    answer = transformer.post_json({"instances": [1.0, 2.5]}, path=f"/v1/models/{NAME}:predict")
    assert answer.status == 200, answer.body
    assert answer.json() == {"predictions": expected, "protocol": protocol}
    # The predictor was really called, over the protocol asked for.
    predictor.wait_for_record(
        lambda r: r.get("http_path") == predictor_path and r.get("http_status") == 200
    )


def test_a_transformer_whose_predictor_is_down_answers_an_error(make_server):
    transformer = start_transformer(make_server, f"127.0.0.1:{free_port()}")
    answer = transformer.post_json({"instances": [1.0]}, path=f"/v1/models/{NAME}:predict")
    assert answer.status == 500
    assert "error" in answer.json()


def test_a_transformer_gives_up_on_a_slow_predictor_after_its_timeout(make_server, predictor):
    transformer = start_transformer(
        make_server,
        f"127.0.0.1:{predictor.port}",
        "--predictor_protocol",
        "v2",
        "--predictor_request_timeout_seconds",
        "1",
    )
    slow = {"inputs": [{"name": "sleep", "shape": [1], "datatype": "FP64", "data": [1.5]}]}
    answer = transformer.post_json(slow, path=f"/v2/models/{NAME}/infer")  # the predictor: 3 s
    assert answer.status == 500, answer.body
    assert "Timeout" in answer.json()["error"]


def test_a_transformer_reached_over_grpc_reaches_its_predictor_over_grpc(make_server, predictor):
    transformer = start_transformer(
        make_server, f"127.0.0.1:{predictor.grpc_port}", "--predictor_protocol", "grpc-v2"
    )

    async def ask() -> Any:
        client = InferenceGRPCClient(url=f"127.0.0.1:{transformer.grpc_port}", timeout=20)
        tensor = InferInput(name="x", shape=[2], datatype="FP64")
        tensor.set_data_from_numpy(np.array([1.0, 3.0]), binary_data=False)
        try:
            return await client.infer(InferRequest(model_name=NAME, infer_inputs=[tensor]))
        finally:
            await client.close()

    (output,) = asyncio.run(ask()).outputs
    # doubled by the transformer, doubled again by the predictor
    assert (output.name, output.as_numpy().tolist()) == ("y", [4.0, 12.0])


def run_script(handler_dir: str, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    http_port, health_port = free_ports(2)  # two calls of free_port() may give the same one
    return subprocess.run(
        runtime_command("kserve", script, "--http_port", str(http_port), *args),
        cwd=HANDLERS / handler_dir,
        env=runtime_env(ABEJA_RUNTIME_HOST="127.0.0.1", HEALTHCHECK_PORT=str(health_port)),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_script_that_starts_no_server_stops_the_start_with_a_message():
    finished = run_script("st_kserve_async", "model.py", "--enable_grpc", "false")
    assert finished.returncode == 1, finished
    messages = [json.loads(line).get("message", "") for line in finished.stdout.splitlines()]
    assert any("never called ModelServer().start([...])" in m for m in messages), messages


def test_kserve_usage_and_bad_arguments():
    usage = subprocess.run(
        runtime_command("kserve", "--help"), capture_output=True, text=True, check=False
    )
    assert usage.returncode == 0
    assert "Usage: abeja-runtime kserve SCRIPT" in usage.stdout

    bad = subprocess.run(
        runtime_command("kserve", "model.py", "--http_port", "eighty"),
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2
    assert "abeja-runtime: error:" in bad.stderr
    assert "eighty" in bad.stderr
