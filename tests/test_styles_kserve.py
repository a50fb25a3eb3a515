"""KServe custom models served by the ``kserve`` style adapter, against the real kserve package.

``samples/kserve_custom/main.py`` is the custom model example of KServe's docs (its AlexNet replaced
by a numpy stand-in); ``st_kserve_async`` has async methods. The runtime serves both over real
HTTP with KServe's V1 and V2 (Open Inference) REST protocols.
"""

from __future__ import annotations

import base64
import http.client
import io
import json
import re
import shutil
import signal
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from helpers.servers import KSERVE_CUSTOM
from helpers.waiting import wait_until
from PIL import Image

from abeja_runtime.launch import free_ports
from abeja_runtime.styles.kserve import adapter as kserve_style

pytest.importorskip("kserve", reason="the KServe style is tested against the kserve package")

NAME = "custom-model"


def image_b64() -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 100, 50)).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


IMAGE_REQUEST = json.dumps({"instances": [{"image": {"b64": image_b64()}}]}).encode()


@pytest.fixture(scope="module")
def custom(make_module_server):
    # --timeout 2.5 is in sys.argv, which kserve parses at import (it would read it as its
    # --timeout-keep-alive, an int, and exit); the runtime hides its flags from the module.
    return make_module_server(
        KSERVE_CUSTOM, "--model-name", NAME, "--timeout", "2.5", env={"HANDLER": "main"}
    )


@pytest.fixture(scope="module")
def asynchronous(make_module_server):
    return make_module_server("st_kserve_async", env={"HANDLER": "model:AsyncModel"})


def test_the_docs_custom_model_is_detected_and_logged(custom):
    record = custom.wait_for_record(lambda r: r.get("style") == "kserve")
    assert "main.AlexNetModel is a kserve.Model" in record["message"], record


def test_v1_predict_runs_preprocess_predict_postprocess(custom):
    answer = custom.post_json(
        {"instances": [{"image": {"b64": image_b64()}}]}, path=f"/v1/models/{NAME}:predict"
    )
    assert answer.status == 200, answer.body
    assert answer.headers["Content-Type"] == "application/json"
    predictions = answer.json()["predictions"]
    assert len(predictions) == 5
    assert predictions == sorted(predictions, reverse=True)
    assert predictions[0] == pytest.approx(200 / 255, abs=1e-3)


def test_v2_infer_decodes_an_infer_request_and_encodes_the_infer_response(custom):
    body = {
        "inputs": [{"name": "input-0", "shape": [1], "datatype": "BYTES", "data": [image_b64()]}]
    }
    answer = custom.post_json(body, path=f"/v2/models/{NAME}/infer")
    assert answer.status == 200, answer.body
    result = answer.json()
    assert result["model_name"] == NAME
    assert set(result) == {"model_name", "model_version", "id", "parameters", "outputs"}
    (output,) = result["outputs"]
    assert (output["name"], output["shape"], output["datatype"]) == ("output-0", [1, 5], "FP32")
    assert output["data"][0] == pytest.approx(200 / 255, abs=1e-3)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/", {"status": "alive"}),
        ("/v1/models", {"models": [NAME]}),
        (f"/v1/models/{NAME}", {"name": NAME, "ready": True}),
        ("/v2/health/live", {"live": True}),
        ("/v2/health/ready", {"ready": True}),
        ("/v2/models", {"models": [NAME]}),
        (f"/v2/models/{NAME}/ready", {"name": NAME, "ready": True}),
        (
            f"/v2/models/{NAME}",
            {"name": NAME, "versions": None, "platform": "", "inputs": [], "outputs": []},
        ),
        (
            "/v2",
            {
                "name": "kserve",
                "version": metadata.version("kserve"),
                "extensions": ["model_repository_extension"],
            },
        ),
    ],
)
def test_health_and_metadata_endpoints(custom, path, expected):
    answer = custom.request("GET", path)
    assert (answer.status, answer.json()) == (200, expected)


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "error"),
    [
        (
            "POST",
            "/v1/models/nope:predict",
            b'{"instances": []}',
            404,
            "Model with name nope does not exist.",
        ),
        ("GET", "/v2/models/nope/ready", None, 404, "Model with name nope does not exist."),
        ("POST", f"/v1/models/{NAME}:predict", b'{"foo": 1}', 400, "invalid payload"),
        ("POST", f"/v1/models/{NAME}:predict", b"not json", 400, "Unrecognized request format: "),
        (
            "POST",
            f"/v1/models/{NAME}:explain",
            IMAGE_REQUEST,
            501,
            "Could not find explainer_host.",
        ),
        (
            "GET",
            f"/v2/models/{NAME}/versions/1/ready",
            None,
            501,
            "Model versioning not supported yet.",
        ),
    ],
    ids=[
        "unknown-model",
        "unknown-model-ready",
        "invalid-input",
        "not-json",
        "explain",
        "versions",
    ],
)
def test_errors_have_kserve_s_status_and_body(custom, method, path, body, status, error):
    headers = {"Content-Type": "application/json"} if body is not None else {}
    answer = custom.request(method, path, body, headers)
    assert answer.status == status, answer.body
    assert answer.json()["error"].startswith(error), answer.json()
    assert custom.health() == 200


def test_unknown_routes_and_methods_answer_like_fastapi(custom):
    missing = custom.request("GET", "/v3/models")
    assert (missing.status, missing.json()) == (404, {"detail": "Not Found"})
    refused = custom.request("PUT", "/v2/health/live", b"", {"Content-Type": "application/json"})
    assert (refused.status, refused.json()) == (405, {"detail": "Method Not Allowed"})
    assert refused.headers["Allow"] == "GET"


def test_post_to_root_is_predict_or_infer_for_run_local(custom):
    v1 = custom.post_json({"instances": [{"image": {"b64": image_b64()}}]})
    assert len(v1.json()["predictions"]) == 5, v1.body
    body = {
        "inputs": [{"name": "input-0", "shape": [1], "datatype": "BYTES", "data": [image_b64()]}]
    }
    v2 = custom.post_json(body)
    assert v2.json()["outputs"][0]["name"] == "output-0"


def test_sync_models_run_on_the_handler_thread_async_ones_on_the_loop(asynchronous):
    record = asynchronous.wait_for_record(lambda r: r.get("style") == "kserve")
    assert "HANDLER[model:AsyncModel] with the kserve style" in record["message"]
    answer = asynchronous.post_json({"instances": [1, 2]}, path="/v1/models/model:predict")
    assert answer.json() == {"predictions": [1, 2], "thread": "MainThread"}


def test_async_v2_infer_and_typed_metadata(asynchronous):
    body = {"inputs": [{"name": "x", "shape": [3], "datatype": "FP64", "data": [1, 2.5, 3]}]}
    answer = asynchronous.post_json(body, path="/v2/models/model/infer")
    assert answer.status == 200, answer.body
    output = answer.json()["outputs"][0]
    assert (output["name"], output["data"]) == ("doubled", [2.0, 5.0, 6.0])
    assert asynchronous.request("GET", "/v2/models/model").json()["inputs"] == [
        {"name": "x", "datatype": "FP64", "shape": [-1]}
    ]


def test_sync_model_thread(make_server, tmp_path):
    (tmp_path / "main.py").write_text(
        "import threading\nfrom kserve import Model\n\n"
        "class Sync(Model):\n"
        "    def predict(self, payload, headers=None):\n"
        "        return {'thread': threading.current_thread().name}\n"
    )
    server = make_server(tmp_path)  # HANDLER main:handler: main.py's one kserve.Model is used
    answer = server.post_json({"instances": []}, path="/v1/models/model:predict")
    assert answer.json() == {"thread": "MainThread"}  # the handler process's, which loaded it


def test_a_model_that_becomes_unready_answers_503(make_server):
    server = make_server("st_kserve_async", env={"HANDLER": "model:AsyncModel"})
    server.post_json({"instances": ["unready"]}, path="/v1/models/model:predict")
    for path, method in (("/v1/models/model:predict", "POST"), ("/v2/models/model/ready", "GET")):
        body = b'{"instances": [1]}' if method == "POST" else None
        answer = server.request(method, path, body, {"Content-Type": "application/json"})
        assert answer.status == 503
        assert answer.json() == {"error": "Model with name model is not ready."}
    assert server.health() == 200  # the ABEJA health check reports the process, not the model


def test_each_worker_stops_its_model_after_the_last_request(make_server):
    """KServe's ModelServer calls Model.stop() as it stops; so does each worker, once drained."""
    server = make_server("st_kserve_async", "--workers", "2", env={"HANDLER": "model:AsyncModel"})
    assert server.request("POST", "/v1/models/model:predict", b'{"instances": [1]}').status == 200
    assert server.stop(signal.SIGTERM) == 0
    messages = [record.get("message", "") for record in server.records()]
    assert messages.count("model model stopped") == 2, messages
    answered = max(i for i, record in enumerate(server.records()) if "http_status" in record)
    stopped = messages.index("model model stopped")
    assert stopped > answered, "stop() ran before the last answer"


def test_a_model_still_unready_after_load_stops_the_start(make_server, tmp_path):
    (tmp_path / "main.py").write_text(
        "from kserve import Model\n\n"
        "class Lazy(Model):\n"
        "    def load(self):\n"
        "        return False\n"
    )
    server = make_server(tmp_path, "--handler", "main:Lazy", wait=False)
    assert server.wait_exit(20) != 0
    messages = [str(r.get("message")) for r in server.records()]
    assert any("Model with name model is not ready" in m for m in messages), server.lines


# --- against KServe itself ------------------------------------------------------------------------

#: V2 bodies that KServe's FastAPI server refuses before the model sees them (422, FastAPI's
#: ``detail`` list), or hands to KServe as bytes (400); each as (content type, body).
V2_REFUSED = [
    ("application/json", b'{"inputs": 5}'),
    ("application/json", b"not json"),
    ("application/json", b'{"inputs": [{"name": "x"}]}'),
    ("application/json", b"[1]"),
    ("application/json; charset=utf-8", b'{"inputs": [{"name": "x", "shape": [1]}]}'),
    ("text/plain", b'{"inputs": 5}'),
    (None, b'{"inputs": 5}'),
]


@pytest.fixture(scope="module")
def kserve_itself(tmp_path_factory):
    """The same main.py served by KServe's own ModelServer (python main.py), as a control."""
    folder = tmp_path_factory.mktemp("kserve") / "model"
    shutil.copytree(KSERVE_CUSTOM, folder)
    ports = free_ports(2)
    command = [sys.executable, "main.py", "--model_name", NAME]
    command += ["--http_port", str(ports[0]), "--grpc_port", str(ports[1])]
    process = subprocess.Popen(
        command, cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )

    def live() -> bool:
        assert process.poll() is None, "KServe's ModelServer exited"
        try:
            return ask(ports[0], "GET", "/v2/health/live", None, None)[0] == 200
        except OSError:
            return False

    try:
        wait_until(live, 60, "KServe's ModelServer to be live")
        yield ports[0]
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def ask(port, method, path, content_type, body):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        headers = {"Content-Type": content_type} if content_type else {}
        connection.request(method, path, body=body, headers=headers)
        answer = connection.getresponse()
        return answer.status, json.loads(answer.read())
    finally:
        connection.close()


@pytest.mark.parametrize(("content_type", "body"), V2_REFUSED)
def test_a_v2_body_kserve_refuses_is_refused_alike(custom, kserve_itself, content_type, body):
    path = f"/v2/models/{NAME}/infer"
    expected = ask(kserve_itself, "POST", path, content_type, body)
    assert ask(custom.port, "POST", path, content_type, body) == expected
    assert expected[0] in (400, 422)


def test_openapi_docs_and_metrics_are_served_as_kserve_serves_them(custom, kserve_itself):
    """/openapi.json is KServe's own document for the model; /docs is off unless asked for
    (--enable_docs_url, see test_styles_kserve_script.py); /metrics is on the HTTP port."""
    assert ask(custom.port, "GET", "/openapi.json", None, None) == ask(
        kserve_itself, "GET", "/openapi.json", None, None
    )
    for port in (custom.port, kserve_itself):
        assert ask(port, "GET", "/docs", None, None) == (404, {"detail": "Not Found"})
    for port in (custom.port, kserve_itself):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            connection.request("GET", "/metrics")
            answer = connection.getresponse()
            body = answer.read().decode()
        finally:
            connection.close()
        assert answer.status == 200
        assert answer.getheader("Content-Type").startswith("text/plain")
        assert "# TYPE " in body, body[:300]
    ours = custom.request("GET", "/metrics").body.decode()
    assert "abeja_runtime_requests_total" in ours


def test_the_tested_kserve_releases_are_those_the_test_extra_installs():
    """``TESTED_KSERVE`` is said once more, in pyproject.toml's test extra: both agree, and the
    kserve installed here (the one the suite ran with) is one of them."""
    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    pins = re.findall(r'^\s*"kserve([^"]*)",', pyproject, flags=re.MULTILINE)
    assert pins == [kserve_style.TESTED_KSERVE]
    assert kserve_style.untested(metadata.version("kserve")) is False


@pytest.mark.parametrize(
    ("version", "untested"), [("0.21.3", False), ("0.22.0", True), ("0.20.1", True)]
)
def test_a_kserve_release_outside_the_tested_ones_is_named_in_the_log(version, untested):
    assert kserve_style.untested(version) is untested


@pytest.mark.parametrize(
    ("path", "status", "said"),
    [
        (f"/v1/models/{NAME}:predict", 400, b"Unrecognized request format"),
        (f"/v2/models/{NAME}/infer", 422, b"json_invalid"),
    ],
    ids=["v1", "v2"],
)
def test_a_body_nested_too_deeply_for_the_parser_is_the_caller_s_error(custom, path, status, said):
    """Python's parser refuses JSON nested past about 1,000 levels: the caller's fault, as
    KServe's server says it, not the model's (the v2 path answered 500)."""
    body = b"[" * 2000 + b"]" * 2000
    answer = custom.request("POST", path, body, {"Content-Type": "application/json"})
    assert (answer.status, said in answer.body) == (status, True), answer.body
    assert custom.health() == 200
