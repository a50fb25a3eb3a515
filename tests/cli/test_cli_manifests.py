"""``abeja model manifests``: documents valid for the engine that applies them, offline.

* Kubernetes kinds: kubernetes-validate (the OpenAPI schema of Kubernetes 1.30), strict.
* KServe: ``schemas/kserve-inferenceservice.json`` (written from the InferenceService CRD,
  source named in it), the kserve SDK's generated models (the Go types the CRD is generated
  from) walked strictly, and the predictor's containers as a Kubernetes PodSpec.
* Knative: ``schemas/knative-service.json`` (written from the Service CRD, source named in it)
  for Knative's fields, and the pod template as a Kubernetes PodSpec.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers.cli import Result, run_abeja

K8S_VERSION = "1.30"
SCHEMAS = Path(__file__).parent / "schemas"


def manifests(*args: str, cwd: Path) -> tuple[Result, list[dict[str, Any]]]:
    result = run_abeja("model", "manifests", *args, cwd=cwd)
    documents = list(yaml.safe_load_all(result.stdout)) if result.returncode == 0 else []
    return result, documents


def validate_kubernetes(document: dict[str, Any]) -> None:
    import kubernetes_validate

    kubernetes_validate.validate(document, K8S_VERSION, strict=True)


def validate_sdk_model(value: Any, type_name: str, path: str = "") -> None:
    """Check ``value`` against a swagger-generated model of the kserve / kubernetes SDKs."""
    import kserve.models
    from kubernetes.client import models as core

    if type_name.startswith(("list[", "List[")):
        assert isinstance(value, list), path
        for i, item in enumerate(value):
            validate_sdk_model(item, type_name[5:-1], f"{path}[{i}]")
        return
    if type_name.startswith(("dict(", "Dict[")):
        assert isinstance(value, dict), path
        for key, item in value.items():
            validate_sdk_model(item, type_name[5:-1].split(", ", 1)[1], f"{path}.{key}")
        return
    primitives: dict[str, Any] = {"str": str, "int": int, "bool": bool, "float": (int, float)}
    if type_name == "object":
        return
    if type_name in primitives:
        assert isinstance(value, primitives[type_name]), f"{path}: {value!r} is not {type_name}"
        assert type_name == "bool" or not isinstance(value, bool), path
        return
    model = getattr(kserve.models, type_name, None) or getattr(core, type_name)
    assert isinstance(value, dict), f"{path}: {type_name} must be an object"
    by_key = {key: attribute for attribute, key in model.attribute_map.items()}
    unknown = set(value) - set(by_key)
    assert not unknown, f"{path}: {type_name} has no field {sorted(unknown)}"
    for key, item in value.items():
        validate_sdk_model(item, model.openapi_types[by_key[key]], f"{path}.{key}")


def test_kubernetes_documents_are_valid_and_production_ready(tmp_path: Path) -> None:
    (tmp_path / "model.env").write_text("FROM_FILE=1\n")
    result, documents = manifests(
        "--image", "registry.example.com/team/my_model:1", "--target", "kubernetes",
        "-e", "LOG_LEVEL=warning", "--env-file", "model.env", "--workers", "2",
        "--grace-period", "20", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, str(result)
    kinds = [document["kind"] for document in documents]
    assert kinds == ["Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"]
    for document in documents:
        validate_kubernetes(document)

    pod = documents[0]["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert documents[0]["metadata"]["name"] == "my-model"
    assert container["image"] == "registry.example.com/team/my_model:1"
    assert container["readinessProbe"]["httpGet"] == {"path": "/health_check", "port": "health"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "health"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert pod["spec"]["terminationGracePeriodSeconds"] > 20 + 5  # grace + the kill margin
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == "5001"
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env["FROM_FILE"] == "1" and env["LOG_LEVEL"] == "warning"
    assert env["ABEJA_RUNTIME_WORKERS"] == "2"
    assert container["resources"]["requests"] and container["resources"]["limits"]


@pytest.mark.parametrize("target", ["kubernetes", "knative", "kserve"])
def test_the_yaml_has_no_anchors_or_aliases(tmp_path: Path, target: str) -> None:
    """Documents that share dicts (labels, the selector) are written out in full each time,
    not as ``&id001`` and ``*id001``."""
    result, documents = manifests("--image", "mymodel:1", "--target", target, cwd=tmp_path)
    assert result.returncode == 0, str(result)
    events = list(yaml.parse(result.stdout))
    assert not [event for event in events if isinstance(event, yaml.AliasEvent)], result.text
    assert not [event for event in events if getattr(event, "anchor", None)], result.text
    assert documents == [json.loads(json.dumps(document)) for document in documents]


@pytest.mark.parametrize("target", ["kubernetes", "knative", "kserve"])
def test_secrets_reach_the_container_by_reference(tmp_path: Path, target: str) -> None:
    result, documents = manifests(
        "--image", "m:1", "--target", target, "--secret", "model-token", "--secret", "db",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, str(result)
    text = result.stdout.decode()
    assert "secretRef" in text
    found = [
        item["secretRef"]["name"]
        for container in _containers(documents[0])
        for item in container.get("envFrom", [])
    ]
    assert found == ["model-token", "db"]
    if target == "kubernetes":
        validate_kubernetes(documents[0])


def _containers(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The model's containers, wherever the target keeps them."""
    spec = document["spec"]
    if document["kind"] == "InferenceService":
        return list(spec["predictor"]["containers"])
    return list(spec["template"]["spec"]["containers"])


def test_a_bad_secret_name_is_refused(tmp_path: Path) -> None:
    result = run_abeja("model", "manifests", "--image", "m:1", "--target", "kubernetes",
                       "--secret", "Bad_Name", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 2, str(result)
    assert "--secret 'Bad_Name' is not a Kubernetes Secret name" in result.stderr


def test_knative_service_is_valid(tmp_path: Path) -> None:
    import jsonschema

    result, documents = manifests(
        "--image", "my_model:1", "--target", "knative", "--workers", "2",
        "--concurrency", "3", "--timeout", "90.5", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, str(result)
    (service,) = documents
    schema = json.loads((SCHEMAS / "knative-service.json").read_text())
    jsonschema.validate(service, schema)
    spec = dict(service["spec"]["template"]["spec"])
    assert spec.pop("containerConcurrency") == 6
    assert spec.pop("timeoutSeconds") == 91
    validate_kubernetes(
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "template"}, "spec": spec}
    )


def test_kserve_inference_service_is_valid(tmp_path: Path) -> None:
    result, documents = manifests("--image", "my_model:1", "--target", "kserve", cwd=tmp_path)
    assert result.returncode == 0, str(result)
    (service,) = documents
    import jsonschema

    jsonschema.validate(service, json.loads((SCHEMAS / "kserve-inferenceservice.json").read_text()))
    validate_sdk_model(service, "V1beta1InferenceService")
    predictor = service["spec"]["predictor"]
    pod = {key: value for key, value in predictor.items() if key in ("containers", "volumes")}
    validate_kubernetes({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": pod})
    assert predictor["containers"][0]["image"] == "my_model:1"
    assert predictor["containerConcurrency"] == 1
    assert predictor["timeout"] == 60


def test_the_validators_can_fail(tmp_path: Path) -> None:
    """A wrong field is caught by each validator, so that the tests above mean something."""
    import kubernetes_validate

    _, (deployment, *_) = manifests("--image", "m:1", "--target", "kubernetes", cwd=tmp_path)
    deployment["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_kubernetes(deployment)
    _, (inference,) = manifests("--image", "m:1", "--target", "kserve", cwd=tmp_path)
    inference["spec"]["predictor"]["containers"][0]["imag"] = "typo"
    with pytest.raises(AssertionError, match="has no field"):
        validate_sdk_model(inference, "V1beta1InferenceService")
    import jsonschema

    inference["spec"]["predictor"]["timeout"] = "sixty"
    schema = json.loads((SCHEMAS / "kserve-inferenceservice.json").read_text())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(inference, schema)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--image", "m:1", "--target", "swarm"], "--target 'swarm' is not one of"),
        (["--image", "Bad Image", "--target", "kserve"], "is not an image name Docker accepts"),
        (["--image", "m:1", "--target", "kserve", "-e", "X"], "-e 'X' has no value"),
        (["--image", "m:1", "--target", "kserve", "--name", "9x"], "is not a Kubernetes name"),
        (["--image", "m:1", "--target", "kserve", "--env-file", "nope.env"], "does not exist"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_with_nothing_written(
    project: Callable[[str], Path], args: list[str], message: str
) -> None:
    cwd = project("tax")
    before = sorted(p.name for p in cwd.iterdir())
    result = run_abeja("model", "manifests", *args, "--output", "out.yaml", cwd=cwd)
    assert result.returncode == 2, str(result)
    assert result.stdout == b""
    assert len(result.error_lines()) == 1 and message in result.error_lines()[0], str(result)
    assert sorted(p.name for p in cwd.iterdir()) == before
