"""Cortex request handlers in front of an ONNX model (onnxruntime), served by the runtime.

The handlers are the iris examples of Cortex's docs, both signature generations, unchanged. The
model is built at test time with the ``onnx`` package by the cortex_iris sample's build script
(no download).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.cortex import build_model
from helpers.servers import HANDLERS, START_TIMEOUT

#: A runtime that cannot load its model exits once the load failed: as long as a start may take
#: on a loaded machine (an ONNX session's import is slow there).
EXIT_TIMEOUT = START_TIMEOUT

SETOSA = {"sepal_length": 5.1, "sepal_width": 3.5, "petal_length": 1.4, "petal_width": 0.2}
VERSICOLOR = {"sepal_length": 6.4, "sepal_width": 3.2, "petal_length": 4.5, "petal_width": 1.5}
VIRGINICA = {"sepal_length": 6.3, "sepal_width": 3.3, "petal_length": 6.0, "petal_width": 2.5}


@pytest.fixture
def project(tmp_path: Path):
    """A copy of a handler folder with the iris model next to it."""

    def make(handler: str, *, label_first: bool = True, model: str = "iris.onnx") -> Path:
        folder = tmp_path / handler
        shutil.copytree(HANDLERS / handler, folder)
        build_model(folder / model, label_first=label_first)
        return folder

    return make


def load_failure(server) -> str:
    """Wait for a runtime that cannot load its handler to exit; return the error message."""
    assert server.wait_exit(EXIT_TIMEOUT) != 0, server.lines
    found = [r for r in server.records() if str(r.get("message", "")).startswith("failed to")]
    assert found, server.lines
    return found[0]["message"]


@pytest.mark.parametrize(
    ("sample", "label"),
    [(SETOSA, "iris-setosa"), (VERSICOLOR, "iris-versicolor"), (VIRGINICA, "iris-virginica")],
)
def test_the_docs_iris_example_end_to_end(make_server, project, sample, label):
    server = make_server(project("st_cortex_iris"), env={"HANDLER": "handler"})
    record = server.wait_for_record(lambda r: r.get("style") == "cortex")
    assert "handler defines pre_inference and post_inference" in record["message"]
    answer = server.post_json(sample, path="/predict")
    assert answer.status == 200, answer.body
    assert answer.headers["Content-Type"] == "application/json"
    assert answer.json() == label


def test_the_first_generation_iris_example_answers_predictions_per_sample(make_server, project):
    folder = project("st_cortex_iris_v0", label_first=False)
    server = make_server(folder, "--handler", "handler:pre_inference")
    answer = server.post_json({"samples": [SETOSA, VIRGINICA]}, path="/iris/classifier")
    assert answer.status == 200, answer.body
    predictions = answer.json()["predictions"]
    assert [p["class_label"] for p in predictions] == ["iris-setosa", "iris-virginica"]
    assert [p["class_index"] for p in predictions] == [0, 2]
    for prediction in predictions:
        assert len(prediction["probabilities"]) == 3
        assert sum(prediction["probabilities"]) == pytest.approx(1.0, abs=1e-5)


def test_the_first_generation_wants_a_samples_list(make_server, project):
    server = make_server(
        project("st_cortex_iris_v0", label_first=False), env={"HANDLER": "handler"}
    )
    answer = server.post_json(SETOSA)
    assert answer.status == 406
    assert answer.body == b'prediction failed: top level "samples" key not found in request'


def test_metadata_and_signature_reach_the_functions_and_both_are_optional(make_server, tmp_path):
    (tmp_path / "handler.py").write_text(
        "def post_inference(prediction, signature, metadata):\n"
        "    return {'metadata': metadata, 'outputs': [node.name for node in signature],\n"
        "            'label': int(prediction[0][0])}\n"
    )
    build_model(tmp_path / "model.onnx")
    server = make_server(
        tmp_path,
        env={
            "HANDLER": "handler",
            "ABEJA_RUNTIME_CORTEX_MODEL": "model.onnx",
            "ABEJA_RUNTIME_CORTEX_METADATA": '{"labels": ["a", "b", "c"]}',
        },
    )
    # No pre_inference: the payload is keyed by the model's input name, as in Cortex.
    answer = server.post_json({"input": [6.3, 3.3, 6.0, 2.5]})
    assert answer.json() == {
        "metadata": {"labels": ["a", "b", "c"]},
        "outputs": ["label", "probabilities"],
        "label": 2,
    }


def test_without_handler_functions_the_model_outputs_are_the_answer(make_server, tmp_path):
    (tmp_path / "handler.py").write_text('"""Cortex serves the model alone."""\n')
    build_model(tmp_path / "model.onnx")
    server = make_server(tmp_path, "--style", "cortex", "--handler", "handler")
    answer = server.post_json([5.1, 3.5, 1.4, 0.2])
    label, probabilities = answer.json()
    assert label == [0]
    assert len(probabilities[0]) == 3


def test_get_describes_the_model_signature(make_server, project):
    server = make_server(project("st_cortex_iris"), env={"HANDLER": "handler"})
    answer = server.request("GET", "/predict")
    assert answer.json()["model_signature"] == {"input": {"shape": ["batch", 4], "type": "float32"}}


@pytest.mark.parametrize(
    ("body", "status", "text"),
    [
        (b'{"sepal_length": ', 400, "malformed json"),
        (json.dumps({"sepal_length": 5.0}).encode(), 406, "prediction failed: pre_inference"),
    ],
    ids=["not-json", "missing-feature"],
)
def test_errors_are_cortex_s(make_server, project, body, status, text):
    server = make_server(project("st_cortex_iris"), env={"HANDLER": "handler"})
    answer = server.request("POST", "/predict", body, {"Content-Type": "application/json"})
    assert answer.status == status
    assert answer.body.decode().startswith(text), answer.body
    assert server.health() == 200  # the server stays up


def test_the_model_is_found_in_the_training_result_dir(make_server, tmp_path):
    folder = tmp_path / "code"
    shutil.copytree(HANDLERS / "st_cortex_iris", folder)
    (folder / "abejainc_training_result").mkdir()
    build_model(folder / "abejainc_training_result" / "iris.onnx")
    server = make_server(folder, env={"HANDLER": "handler"})
    assert server.post_json(SETOSA).json() == "iris-setosa"


def test_several_onnx_files_must_be_chosen_between(make_server, project):
    folder = project("st_cortex_iris")
    build_model(folder / "other.onnx")
    message = load_failure(make_server(folder, env={"HANDLER": "handler"}, wait=False))
    assert "several models (iris.onnx, other.onnx)" in message
    assert "--cortex-model" in message


def test_a_saved_model_that_cannot_be_read_is_refused_clearly(make_server, project):
    pytest.importorskip("tensorflow", reason="SavedModels are run with TensorFlow")
    folder = project("st_cortex_iris")
    (folder / "iris.onnx").unlink()
    (folder / "savedmodel" / "variables").mkdir(parents=True)
    (folder / "savedmodel" / "saved_model.pb").write_bytes(b"\x08\x01")
    server = make_server(
        folder, env={"HANDLER": "handler", "ABEJA_RUNTIME_CORTEX_MODEL": "savedmodel"}, wait=False
    )
    message = load_failure(server)
    assert "savedmodel has no meta graph tagged 'serve'" in message


def test_a_frozen_graph_is_refused_with_what_to_give_instead(make_server, project):
    folder = project("st_cortex_iris")
    (folder / "frozen.pb").write_bytes(b"\x08\x01")
    server = make_server(
        folder, env={"HANDLER": "handler", "ABEJA_RUNTIME_CORTEX_MODEL": "frozen.pb"}, wait=False
    )
    message = load_failure(server)
    assert "is a TensorFlow graph file (.pb)" in message
    assert "SavedModel directory" in message


# -- TensorFlow SavedModels ---------------------------------------------------------------


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory) -> Path:
    """The iris SavedModel of st_cortex_tf, built by TensorFlow in a process of its own."""
    pytest.importorskip("tensorflow", reason="SavedModels are run with TensorFlow")
    target = tmp_path_factory.mktemp("saved") / "iris"
    built = subprocess.run(
        [sys.executable, str(HANDLERS / "st_cortex_tf" / "build_saved_model.py"), str(target)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert built.returncode == 0, built.stderr
    return target


@pytest.fixture(scope="module")
def tf_server(make_module_server, saved_model):
    return make_module_server(
        "st_cortex_tf",
        "--cortex-model",
        str(saved_model),
        env={"HANDLER": "handler"},
    )


@pytest.mark.parametrize(
    ("sample", "label"),
    [(SETOSA, "iris-setosa"), (VERSICOLOR, "iris-versicolor"), (VIRGINICA, "iris-virginica")],
)
def test_the_tensorflow_example_runs_its_saved_model(tf_server, sample, label):
    answer = tf_server.post_json(sample, path="/predict")
    assert answer.status == 200, answer.body
    assert answer.json() == label


def test_a_saved_model_describes_its_serving_signature(tf_server):
    described = tf_server.request("GET", "/predict").json()
    assert described["model_signature"]["petal_length"] == {"shape": [-1], "type": "float32"}
    record = tf_server.wait_for_record(lambda r: "TensorFlow SavedModel" in r.get("message", ""))
    assert "(sample, signature, metadata) generation" in record["message"]


def test_the_first_generation_gets_the_signature_map_and_lists(make_server, saved_model):
    server = make_server(
        "st_cortex_tf_v0", "--cortex-model", str(saved_model), env={"HANDLER": "handler"}
    )
    answer = server.post_json({"samples": [SETOSA, VIRGINICA]}, path="/predict")
    assert answer.status == 200, answer.body
    first, second = answer.json()["predictions"]
    assert (first["class_label"], second["class_label"]) == ("iris-setosa", "iris-virginica")
    assert first["probabilities"] == pytest.approx(sorted(first["probabilities"], reverse=True))
    assert len(first["probabilities"]) == 3


def test_a_saved_model_in_the_training_result_dir_is_found(make_server, saved_model, tmp_path):
    folder = tmp_path / "code"
    shutil.copytree(HANDLERS / "st_cortex_tf", folder)
    shutil.copytree(saved_model, folder / "abejainc_training_result" / "iris")
    server = make_server(folder, env={"HANDLER": "handler"})
    assert server.post_json(VIRGINICA, path="/predict").json() == "iris-virginica"
