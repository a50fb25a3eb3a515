"""Seldon Core Python components served by the ``seldon`` style adapter, over real HTTP.

``st_seldon_identity/MyModel.py`` is the identity example of Seldon's docs, unchanged, named
the way seldon-core-microservice names it (``MyModel``). ``st_seldon_full`` uses every optional
method; ``st_seldon_raw`` answers with ``predict_raw``. No seldon-core package is installed.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import urllib.parse
import uuid
from pathlib import Path

import numpy as np
import pytest
from helpers.servers import HANDLERS

import abeja_runtime


@pytest.fixture(scope="module")
def identity(make_module_server):
    return make_module_server("st_seldon_identity", env={"HANDLER": "MyModel"})


@pytest.fixture(scope="module")
def full(make_module_server):
    return make_module_server("st_seldon_full", env={"HANDLER": "Classifier"})


def test_the_docs_identity_model_is_detected_and_logged(identity):
    record = identity.wait_for_record(lambda r: r.get("style") == "seldon")
    assert "MyModel.MyModel is named like its module" in record["message"]
    identity.wait_for_record(lambda r: r.get("message") == "Initializing")


@pytest.mark.parametrize(
    "path", ["/api/v1.0/predictions", "/predict", "/api/v0.1/predictions", "/"]
)
def test_the_identity_model_answers_a_seldon_message(identity, path):
    answer = identity.post_json({"data": {"ndarray": [[1, 2, 3]]}}, path=path)
    assert answer.status == 200, answer.body
    assert answer.headers["Content-Type"] == "application/json"
    assert answer.json() == {
        "data": {"names": ["t:0", "t:1", "t:2"], "ndarray": [[1, 2, 3]]},
        "meta": {},
    }
    identity.wait_for_record(
        lambda r: (
            r.get("message") == "Predict called - will run identity function"
            and r.get("request_id") == answer.headers["x-abeja-request-id"]
        )
    )


@pytest.mark.parametrize(
    ("request_data", "expected"),
    [
        (
            {"tensor": {"shape": [2, 2], "values": [1.5, 2, 3, 4]}},
            {"names": ["t:0", "t:1"], "tensor": {"shape": [2, 2], "values": [1.5, 2.0, 3.0, 4.0]}},
        ),
        ({"names": ["a"], "ndarray": ["x", "y"]}, {"names": [], "ndarray": ["x", "y"]}),
        ({"ndarray": [True, False]}, {"names": [], "ndarray": [True, False]}),
    ],
    ids=["tensor", "strings", "booleans"],
)
def test_the_answer_keeps_the_request_s_data_form(identity, request_data, expected):
    answer = identity.post_json({"data": request_data})
    assert answer.json() == {"data": expected, "meta": {}}


def test_a_tftensor_is_read_and_answered_as_seldon_core_does_with_tensorflow(identity):
    """seldon-core reads data.tftensor with tf.make_ndarray and answers with
    tf.make_tensor_proto; no TensorFlow is needed here (the codec is checked against
    TensorFlow's own in test_tftensor.py)."""
    sent = {"dtype": "DT_FLOAT", "tensorShape": {"dim": [{"size": "1"}, {"size": "2"}]},
            "floatVal": [0.5, 1.5]}  # fmt: skip
    answer = identity.post_json({"data": {"tftensor": sent}})
    assert answer.status == 200, answer.body
    content = base64.b64encode(np.array([0.5, 1.5], dtype="<f4").tobytes()).decode()
    assert answer.json()["data"] == {
        "names": ["t:0", "t:1"],
        "tftensor": {
            "dtype": "DT_FLOAT",
            "tensorShape": {"dim": [{"size": "1"}, {"size": "2"}]},
            "tensorContent": content,
        },
    }
    bad = identity.post_json({"data": {"tftensor": {"dtype": "DT_FLOAT", "floatVal": "x"}}})
    assert bad.status == 400
    assert bad.json()["status"]["info"].startswith("Invalid tftensor in request: ")


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ({"strData": "hello"}, {"strData": "hello", "meta": {}}),
        ({"jsonData": {"a": [1, 2]}}, {"jsonData": {"a": [1, 2]}, "meta": {}}),
        ({"binData": base64.b64encode(b"\x00\x01").decode()}, {"binData": "AAE=", "meta": {}}),
    ],
    ids=["strData", "jsonData", "binData"],
)
def test_str_json_and_bin_data_pass_through(identity, message, expected):
    assert identity.post_json(message).json() == expected


def test_predict_gets_names_and_meta_and_the_answer_carries_tags_metrics_and_puid(full):
    message = {
        "data": {"names": ["a", "b"], "ndarray": [[1, 2]]},
        "meta": {"puid": "p-1", "tags": {"client": "x"}},
    }
    answer = full.post_json(message, path="/api/v1.0/predictions")
    assert answer.status == 200, answer.body
    assert answer.json() == {
        "data": {"names": ["low", "high"], "ndarray": [[2.0, 0.0]]},
        "meta": {
            "tags": {"client": "x", "model": "classifier", "loaded": "True"},
            "metrics": [{"type": "COUNTER", "key": "predictions", "value": 1}],
            "puid": "p-1",
        },
    }
    echoed = full.post_json({"jsonData": {"q": 1}, "meta": {"tags": {"t": "1"}}}).json()
    # seldon-core adds the model's tags to the request's own meta, which predict returned here
    all_tags = {"t": "1", "model": "classifier", "loaded": "True"}
    assert echoed["jsonData"] == {"echo": {"q": 1}, "names": [], "meta": {"tags": all_tags}}


def test_runtime_tags_and_metrics_of_a_seldon_response_are_merged(full):
    answer = full.post_json({"data": {"ndarray": [[-3, 0]]}})
    meta = answer.json()["meta"]
    assert meta["tags"]["runtime"] == "tag"
    assert meta["metrics"] == [
        {"type": "COUNTER", "key": "predictions", "value": 1},
        {"type": "TIMER", "key": "t", "value": 1.5},
    ]


@pytest.mark.parametrize(
    ("message", "status", "reason", "info"),
    [
        ({"data": {"ndarray": [[-1, 0]]}}, 500, "MICROSERVICE_INTERNAL_ERROR", "negative one is"),
        ({"data": {"ndarray": [[-2, 0]]}}, 500, "MICROSERVICE_BAD_METRIC", "Bad metric created"),
        ({"foo": 1}, 400, "MICROSERVICE_BAD_DATA", "Invalid request data type"),
        (
            {"data": {"tensor": {"shape": [3], "values": [1]}}},
            400,
            "MICROSERVICE_BAD_DATA",
            "Invalid tensor",
        ),
    ],
    ids=["model-raises", "bad-metric", "no-data", "bad-tensor"],
)
def test_errors_are_seldon_status_messages(full, message, status, reason, info):
    answer = full.post_json(message)
    assert answer.status == status
    error = answer.json()["status"]
    assert (error["status"], error["code"], error["reason"]) == (1, -1, reason)
    assert error["info"].startswith(info), error
    assert full.health() == 200


def test_a_body_that_is_not_json_is_a_400(full):
    answer = full.request("POST", "/predict", b"{nope", {"Content-Type": "application/json"})
    assert answer.status == 400
    assert answer.json()["status"]["info"].startswith("Can't find JSON in data")


def test_the_json_query_parameter_form_and_multipart_fields(full):
    query = urllib.parse.urlencode({"json": json.dumps({"strData": "abc"})})
    assert full.request("GET", f"/predict?{query}").json()["strData"] == "ABC"
    boundary = uuid.uuid4().hex
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="binData"; filename="b.bin"\r\n'
            f"Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        + b"xyz\r\n"
        + f"--{boundary}--\r\n".encode()
    )
    answer = full.request(
        "POST", "/predict", body, {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    )
    assert base64.b64decode(answer.json()["binData"]) == b"zyx"


def test_transformer_routes_call_transform_input_and_output(identity, full):
    assert full.post_json({"data": {"ndarray": [1, 2]}}, path="/transform-input").json()[
        "data"
    ] == {
        "names": [],
        "ndarray": [10, 20],
    }
    assert full.post_json({"data": {"ndarray": [1, 2]}}, path="/transform-output").json()[
        "data"
    ] == {
        "names": [],
        "ndarray": [2, 3],
    }
    # The identity model has no transformer methods: the data passes unchanged.
    identity_answer = identity.post_json({"strData": "same"}, path="/transform-output").json()
    assert identity_answer["strData"] == "same"


def test_health_endpoints(identity, full):
    ping = identity.request("GET", "/health/ping")
    assert (ping.status, ping.body) == (200, b"pong")
    assert identity.request("GET", "/health/status").json() == {"strData": "healthy", "meta": {}}
    status = full.request("GET", "/api/v1.0/health/status").json()
    assert status["jsonData"]["calls"] >= 0
    assert status["meta"]["metrics"] == [{"type": "COUNTER", "key": "predictions", "value": 1}]


def test_metadata_endpoint(identity, full):
    assert identity.request("GET", "/metadata").json() == {
        "name": "",
        "versions": [""],
        "platform": "",
        "inputs": [],
        "outputs": [],
        "custom": {},
    }
    metadata = full.request("GET", "/api/v1.0/metadata").json()
    assert (metadata["name"], metadata["versions"]) == ("classifier", ["v1"])
    assert metadata["inputs"] == [{"name": "features", "datatype": "FP64", "shape": [2]}]


def test_unknown_routes_and_methods(identity):
    assert identity.request("GET", "/nowhere").status == 404
    answer = identity.request("PUT", "/health/ping")
    assert answer.status == 405
    assert answer.json()["status"]["info"] == "method PUT is not allowed here"


def test_predict_raw_answers_as_it_likes_and_can_decline(make_server):
    server = make_server("st_seldon_raw", "--style", "seldon", "--handler", "Raw:Raw")
    assert server.post_json({"data": {"ndarray": [1]}}).json() == {
        "data": {"ndarray": [[1]]},
        "meta": {"raw": True},
    }
    declined = server.post_json({"jsonData": {"fallback": 1}}).json()
    assert declined == {"jsonData": {"fallback": True}, "meta": {}}
    teapot = server.post_json({"jsonData": {"code": 418}})
    assert teapot.status == 418
    assert teapot.json() == {"status": {"code": 418, "info": "custom"}}


def test_custom_metrics_are_exported_on_the_runtimes_metrics_endpoint(make_server):
    from helpers.metrics import scrape, total

    server = make_server("st_seldon_full", env={"HANDLER": "Classifier"})
    for features in ([[1, 2]], [[1, 2]], [[-3, 0]], [[-4, 0]], [[-5, 0]]):
        assert server.post_json({"data": {"ndarray": features}}).status == 200

    samples = scrape(server)

    # metrics() reports COUNTER predictions=1 on each of the five answers.
    assert total(samples, "predictions_total") == 5
    assert total(samples, "t_count") == 1  # TIMER: 1.5 ms, observed in seconds
    assert total(samples, "t_sum") == pytest.approx(0.0015)
    assert total(samples, "t_bucket", le="0.0012341553253454695") == 0  # Seldon's buckets
    assert total(samples, "t_bucket", le="0.001523139367078582") == 1
    assert total(samples, "temperature", room="a") == 21.5  # GAUGE, with its tags as labels
    # The GAUGE "predictions" after the COUNTER of that name is left out, with one warning.
    assert total(samples, "predictions") == 0
    warning = server.wait_for_record(
        lambda r: "'predictions' is not exported" in r.get("message", "")
    )
    assert "first reported as a COUNTER" in warning["message"]


PARAMETERS = json.dumps(
    [
        {"name": "factor", "value": "1.5", "type": "FLOAT"},
        {"name": "label", "value": "cats", "type": "STRING"},
        {"name": "enabled", "value": "true", "type": "BOOL"},
        {"name": "count", "value": "3", "type": "INT"},
    ]
)


@pytest.mark.parametrize("via", ["env", "flag"])
def test_constructor_parameters_arrive_typed(make_server, via):
    env = {"HANDLER": "Scaler"}
    flags: tuple[str, ...] = ("--parameters", PARAMETERS)
    if via == "env":
        env, flags = {**env, "PREDICTIVE_UNIT_PARAMETERS": PARAMETERS}, ()
    server = make_server("st_seldon_params", *flags, env=env)
    answer = server.post_json({"jsonData": {}}).json()["jsonData"]
    assert answer["values"] == {"factor": 1.5, "label": "cats", "enabled": True, "count": 3}
    assert answer["types"] == {"factor": "float", "label": "str", "enabled": "bool", "count": "int"}


def test_a_parameter_that_does_not_parse_stops_the_start_with_seldons_message(make_server):
    bad = json.dumps([{"name": "count", "value": "three", "type": "INT"}])
    server = make_server(
        "st_seldon_params", env={"HANDLER": "Scaler", "PREDICTIVE_UNIT_PARAMETERS": bad}, wait=False
    )
    assert server.wait_exit() == 1
    failure = server.wait_for_record(lambda r: "failed to setup model" in r.get("message", ""))
    assert (
        "Bad model parameter: count with value three can't be parsed as a INT"
        in (failure["message"])
    )


def test_an_unknown_service_type_stops_the_start(make_server):
    server = make_server("st_seldon_identity", "--service-type", "MDL", env={"HANDLER": "MyModel"},
                         wait=False)  # fmt: skip
    assert server.wait_exit() == 1
    failure = server.wait_for_record(lambda r: "failed to setup model" in r.get("message", ""))
    assert "--service-type 'MDL' is not one of MODEL, ROUTER" in failure["message"]
    # SERVICE_TYPE is ABEJA Platform's variable (HTTP): the Seldon style does not read it.
    abeja = make_server("st_seldon_identity", env={"HANDLER": "MyModel", "SERVICE_TYPE": "HTTP"})
    assert abeja.post_json({"data": {"ndarray": [1]}}).status == 200


def test_model_metadata_from_the_environment_is_under_the_models_own(make_server):
    metadata = "name: from-env\nplatform: sklearn\ncustom:\n  team: vision\n"
    server = make_server(
        "st_seldon_params",
        env={
            "HANDLER": "Scaler",
            "PREDICTIVE_UNIT_PARAMETERS": PARAMETERS,
            "MODEL_METADATA": metadata,
        },
    )
    found = server.request("GET", "/metadata").json()
    assert (found["name"], found["versions"]) == ("scaler", ["v2"])  # init_metadata() wins
    assert (found["platform"], found["custom"]) == ("sklearn", {"team": "vision"})


@pytest.mark.parametrize("path", ["/route", "/api/v1.0/route"])
def test_a_router_answers_its_choice_as_seldon_core_does(make_server, path):
    server = make_server("st_seldon_graph", env={"HANDLER": "Units:Router"})
    right = server.post_json({"data": {"ndarray": [[5, 2]]}}, path=path)
    left = server.post_json({"data": {"tensor": {"shape": [1, 2], "values": [-5, 2]}}}, path=path)
    wrong = server.post_json({"data": {"ndarray": [[99, 2]]}}, path=path)

    assert right.json() == {"data": {"names": ["t:0"], "ndarray": [[1]]}, "meta": {}}
    assert left.json() == {
        "data": {"names": ["t:0"], "tensor": {"shape": [1, 1], "values": [0]}},
        "meta": {},
    }
    assert wrong.status == 400
    assert wrong.json()["status"]["info"] == "Routing response must be int but got one"


def test_a_combiner_aggregates_a_message_list(make_server):
    server = make_server("st_seldon_graph", env={"HANDLER": "Units:Combiner"})
    messages = {
        "seldonMessages": [{"data": {"ndarray": [[1, 2]]}}, {"data": {"ndarray": [[3, 4]]}}]
    }

    answer = server.post_json(messages, path="/aggregate")
    empty = server.post_json({"seldonMessages": []}, path="/aggregate")

    assert answer.json() == {"data": {"names": ["t:0", "t:1"], "ndarray": [[2.0, 3.0]]}, "meta": {}}
    assert empty.status == 400
    assert empty.json()["status"]["reason"] == "MICROSERVICE_BAD_DATA"


def test_feedback_reaches_send_feedback_with_reward_truth_and_routing(make_server):
    from helpers.metrics import scrape, total

    server = make_server(
        "st_seldon_graph", env={"HANDLER": "Units:Learner", "PREDICTIVE_UNIT_ID": "learner"}
    )
    feedback = {
        "request": {"data": {"ndarray": [[1, 2]]}},
        "response": {"meta": {"routing": {"learner": 1}}},
        "reward": 0.5,
        "truth": {"data": {"ndarray": [[1]]}},
    }

    answer = server.post_json(feedback, path="/send-feedback")
    seen = server.post_json({"jsonData": {}}).json()["jsonData"]["feedback"]
    samples = scrape(server)

    assert answer.json() == {  # as seldon-core answers it (test_styles_seldon_control)
        "data": {"ndarray": []},
        "meta": {"requestPath": {"learner": "NOT_IMPLEMENTED:NOT_IMPLEMENTED"}},
    }
    assert seen == [{"features": [[1, 2]], "reward": 0.5, "truth": [[1]], "routing": 1}]
    assert total(samples, "seldon_api_model_feedback_total") == 1
    assert total(samples, "seldon_api_model_feedback_reward_total") == 0.5


def test_model_error_handler_blueprints_answer_their_exceptions(make_server):
    """Seldon's custom-error example: the blueprint's handler answers, with its status."""
    pytest.importorskip("flask", reason="model_error_handler is a Flask blueprint")
    server = make_server("st_seldon_errors", env={"HANDLER": "ErrorModel"})
    custom = server.post_json({"data": {"ndarray": [[-1.0]]}})
    assert custom.status == 402
    assert custom.json() == {
        "status": {"status": 402, "message": "Test-Error-Msg", "app_code": 1402}
    }
    other = server.post_json({"data": {"ndarray": [[0.0]]}})  # no handler: Seldon's own 500
    assert other.status == 500
    assert other.json()["status"]["reason"] == "MICROSERVICE_INTERNAL_ERROR"
    server.wait_for_record(lambda r: "custom error handler" in r.get("message", ""))


def test_answers_carry_the_request_path_of_the_unit(make_server):
    unit = {"PREDICTIVE_UNIT_ID": "scaler", "PREDICTIVE_UNIT_IMAGE": "me/scaler:2"}
    server = make_server("st_seldon_identity", env={"HANDLER": "MyModel", **unit})
    upstream = {"data": {"ndarray": [1]}, "meta": {"requestPath": {"router": "me/router:1"}}}
    answer = server.post_json(upstream).json()
    assert answer["meta"]["requestPath"] == {"scaler": "me/scaler:2", "router": "me/router:1"}
    metadata = server.request("GET", "/metadata").json()
    assert (metadata["name"], metadata["versions"]) == ("me/scaler", ["2"])


def test_the_compiled_seldon_protocol_matches_its_proto_files(tmp_path):
    """``styles/seldon/protos/seldon.desc`` is what ``scripts/compile-seldon-protos.sh`` makes
    of the ``.proto`` files beside it (run it after editing them). protoc runs in a process of its
    own: in one that has loaded other protobuf modules it can crash."""
    protoc = pytest.importorskip("grpc_tools.protoc")
    from google.protobuf import descriptor_pb2

    protos = Path(abeja_runtime.__file__).parent / "styles" / "seldon" / "protos"
    google = Path(protoc.__file__).parent / "_proto"
    out = tmp_path / "seldon.desc"
    compiled = subprocess.run(
        [
            sys.executable, "-m", "grpc_tools.protoc", f"-I{protos}", f"-I{google}",
            "--include_imports", f"--descriptor_set_out={out}", str(protos / "prediction.proto"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )  # fmt: skip
    assert compiled.returncode == 0, compiled.stderr

    def parsed(path: Path) -> descriptor_pb2.FileDescriptorSet:
        return descriptor_pb2.FileDescriptorSet.FromString(path.read_bytes())

    assert parsed(out) == parsed(protos / "seldon.desc")


def test_a_refused_grpc_call_is_counted_with_the_status_rest_answers(monkeypatch):
    """The access log and the metrics count a gRPC call by an HTTP status: seldon-core's own
    errors keep theirs (a route the model lacks is the 400 of REST), anything else is 500; the
    client sees seldon-core's UNKNOWN either way."""
    from abeja_runtime.config import Config
    from abeja_runtime.styles.seldon import SeldonOptions
    from abeja_runtime.styles.seldon.adapter import adapt

    monkeypatch.chdir(HANDLERS / "st_seldon_identity")
    monkeypatch.syspath_prepend(str(HANDLERS / "st_seldon_identity"))
    model = __import__("MyModel").MyModel
    config = Config(grpc_port=5005)
    service = adapt(model, config=config, options=SeldonOptions(), workdir=Path.cwd()).rpc
    assert service is not None
    assert service.call("/seldon.protos.Router/Route", b"", ()) == (
        2, b"", "Exception calling application: ", 400,
    )  # fmt: skip
    code, _, details, http_status = service.call("/seldon.protos.Model/Predict", b"\xff", ())
    assert (code, http_status) == (3, 400)  # INVALID_ARGUMENT: not a SeldonMessage
    assert details.startswith("bad message")
