"""``abeja model manifests``: documents valid for the engine that applies them, offline.

* Kubernetes kinds: kubernetes-validate (the OpenAPI schema of Kubernetes 1.30), strict.
* KServe: ``schemas/kserve-inferenceservice.json`` (written from the InferenceService CRD,
  source named in it), the kserve SDK's generated models (the Go types the CRD is generated
  from) walked strictly, and the predictor's containers as a Kubernetes PodSpec.
* Knative: ``schemas/knative-service.json`` (written from the Service CRD, source named in it)
  for Knative's fields, and the pod template as a Kubernetes PodSpec.
* KEDA: ``schemas/keda-scaledobject.json`` (written from the ScaledObject CRD and the prometheus
  scaler's metadata, sources named in it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers.cli import Result, run_abeja
from helpers.servers import ServerFactory

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


def validate_keda(document: dict[str, Any]) -> None:
    import jsonschema

    jsonschema.validate(document, json.loads((SCHEMAS / "keda-scaledobject.json").read_text()))


def validate(document: dict[str, Any]) -> None:
    """``document`` against what checks its kind; a Knative or KServe document's containers
    also as those of a Kubernetes Pod."""
    import jsonschema

    if document["kind"] == "ScaledObject":
        validate_keda(document)
        return
    if document["apiVersion"] == "serving.knative.dev/v1":
        jsonschema.validate(document, json.loads((SCHEMAS / "knative-service.json").read_text()))
    elif document["kind"] == "InferenceService":
        schema = json.loads((SCHEMAS / "kserve-inferenceservice.json").read_text())
        jsonschema.validate(document, schema)
        validate_sdk_model(document, "V1beta1InferenceService")
    else:
        validate_kubernetes(document)
        return
    pod = {"containers": _containers(document), "volumes": [{"name": "tmp", "emptyDir": {}}]}
    validate_kubernetes({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": pod})


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
    _, (_, _, scaled, _) = manifests(
        "--image", "m:1", "--target", "kubernetes", "--autoscaler", "keda", cwd=tmp_path
    )
    for key, bad in (("threshold", "lots"), ("serverAdress", "http://typo"), ("query", 1)):
        wrong = json.loads(json.dumps(scaled))
        wrong["spec"]["triggers"][0]["metadata"][key] = bad
        with pytest.raises(jsonschema.ValidationError):
            validate_keda(wrong)


# -- GPUs, autoscaling, stopping (issue 31) ----------------------------------------------


@pytest.mark.parametrize("target", ["kubernetes", "knative", "kserve"])
@pytest.mark.parametrize(
    ("args", "devices"),
    [
        (["--workers", "3"], "0,1"),  # the workers share the pod's two GPUs, one each
        (["--workers", "1"], None),  # one worker sees both
        (["--workers", "3", "-e", "ABEJA_RUNTIME_DEVICES=1"], "1"),  # the user's wins
    ],
    ids=["workers", "one-worker", "-e"],
)
def test_gpus_are_a_resource_that_the_workers_share(
    tmp_path: Path, target: str, args: list[str], devices: str | None
) -> None:
    result, documents = manifests(
        "--image", "m:1", "--target", target, "--gpus", "2", *args, cwd=tmp_path
    )
    assert result.returncode == 0, str(result)
    validate(documents[0])
    (container,) = _containers(documents[0])
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert container["resources"]["requests"]["nvidia.com/gpu"] == "2"  # equal, as required
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env.get("ABEJA_RUNTIME_DEVICES") == devices


@pytest.mark.parametrize("target", ["kubernetes", "knative", "kserve"])
def test_no_gpus_unless_asked(tmp_path: Path, target: str) -> None:
    result, documents = manifests("--image", "m:1", "--target", target, "--gpus", "0",
                                  "--workers", "2", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, str(result)
    (container,) = _containers(documents[0])
    assert "nvidia.com/gpu" not in json.dumps(container)
    assert "ABEJA_RUNTIME_DEVICES" not in json.dumps(container)


def test_runtime_variables_given_with_e_size_the_service_as_they_size_the_runtime(
    tmp_path: Path,
) -> None:
    """They win over the options in the container's env; the concurrency, the target and the
    timeout Knative holds requests to follow them, not the options they override."""
    result, (service,) = manifests(
        "--image", "m:1", "--target", "knative", "--workers", "1", "--timeout", "60",
        "-e", "ABEJA_RUNTIME_WORKERS=4", "-e", "ABEJA_RUNTIME_TIMEOUT=300", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, str(result)
    validate(service)
    template = service["spec"]["template"]
    (container,) = template["spec"]["containers"]
    env = {item["name"]: item["value"] for item in container["env"]}
    assert (env["ABEJA_RUNTIME_WORKERS"], env["ABEJA_RUNTIME_TIMEOUT"]) == ("4", "300")
    assert template["spec"]["containerConcurrency"] == 4
    assert template["metadata"]["annotations"]["autoscaling.knative.dev/target"] == "3"
    assert template["spec"]["timeoutSeconds"] == 300


@pytest.mark.parametrize(
    ("args", "batching", "pod_concurrency"),
    [
        ([], {}, 2),
        (
            ["--max-batch-size", "8", "--max-batch-wait", "0.005"],
            {"ABEJA_RUNTIME_MAX_BATCH_SIZE": "8", "ABEJA_RUNTIME_MAX_BATCH_WAIT": "0.005"},
            16,
        ),
        (
            ["-e", "ABEJA_RUNTIME_MAX_BATCH_SIZE=4"],
            {"ABEJA_RUNTIME_MAX_BATCH_SIZE": "4", "ABEJA_RUNTIME_MAX_BATCH_WAIT": "0.01"},
            8,
        ),
    ],
    ids=["off", "options", "-e"],
)
def test_batching_is_passed_on_and_a_pod_takes_a_batch_per_handler_slot(
    tmp_path: Path, args: list[str], batching: dict[str, str], pod_concurrency: int
) -> None:
    """--max-batch-size (or its variable with -e) turns batching on in the container, with
    --max-batch-wait; each of the pod's handler slots then runs a batch at once, so Knative
    lets that many requests in. Off, the container's env has neither."""
    result, (service,) = manifests(
        "--image", "m:1", "--target", "knative", "--workers", "2", *args, cwd=tmp_path
    )  # fmt: skip
    assert result.returncode == 0, str(result)
    validate(service)
    template = service["spec"]["template"]
    (container,) = template["spec"]["containers"]
    env = {item["name"]: item["value"] for item in container["env"]}
    assert {name: value for name, value in env.items() if "BATCH" in name} == batching
    assert template["spec"]["containerConcurrency"] == pod_concurrency


@pytest.mark.parametrize(
    ("workers", "concurrency", "target"),
    [(1, 1, 1), (2, 1, 1), (2, 2, 3), (4, 3, 8), (10, 1, 7)],
)
def test_the_knative_target_is_about_70_percent_of_what_a_pod_takes(
    tmp_path: Path, workers: int, concurrency: int, target: int
) -> None:
    result, (service,) = manifests(
        "--image", "m:1", "--target", "knative", "--workers", str(workers),
        "--concurrency", str(concurrency), cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, str(result)
    validate(service)
    template = service["spec"]["template"]
    assert template["spec"]["containerConcurrency"] == workers * concurrency  # the hard limit
    annotations = template["metadata"]["annotations"]
    assert annotations["autoscaling.knative.dev/target"] == str(target)
    # Knative takes its utilisation share of the target (70 % by default): not twice.
    assert annotations["autoscaling.knative.dev/target-utilization-percentage"] == "100"


@pytest.mark.parametrize(
    ("args", "server"),
    [
        ([], "http://prometheus-server.monitoring.svc"),
        (["--prometheus", "https://prom.example.com:9090"], "https://prom.example.com:9090"),
    ],
)
def test_keda_scales_on_the_queued_requests_instead_of_the_hpa(
    tmp_path: Path, args: list[str], server: str
) -> None:
    result, documents = manifests(
        "--image", "reg/my_model:1", "--target", "kubernetes", "--autoscaler", "keda",
        "--workers", "2", "--concurrency", "2", "--replicas", "3", "--max-replicas", "8", *args,
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, str(result)
    kinds = [document["kind"] for document in documents]
    assert kinds == ["Deployment", "Service", "ScaledObject", "PodDisruptionBudget"]
    for document in documents:
        validate(document)
    spec = documents[2]["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                      "name": "my-model"}  # fmt: skip
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (3, 8)
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus"
    assert trigger["metadata"] == {
        "serverAddress": server,
        # Summed over the Deployment's pods, by their label as Prometheus's pod scraping maps it.
        "query": 'sum(abeja_runtime_queued_requests{app_kubernetes_io_name="my-model"})',
        "threshold": "4",  # a call waiting per handler slot of a pod (2 workers x 2)
    }
    labels = documents[0]["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/name"] == "my-model"


def test_keda_queries_a_metric_the_runtime_exports(
    tmp_path: Path, make_server: ServerFactory
) -> None:
    _, documents = manifests("--image", "m:1", "--target", "kubernetes", "--autoscaler", "keda",
                             cwd=tmp_path)  # fmt: skip
    query = documents[2]["spec"]["triggers"][0]["metadata"]["query"]
    metric = query.removeprefix("sum(").split("{", 1)[0]
    server = make_server("sv_pid")
    scrape = server.request("GET", "/metrics", port=server.healthcheck_port).body.decode()
    assert f"# TYPE {metric} gauge" in scrape.splitlines(), scrape


@pytest.mark.parametrize(
    ("args", "drain", "grace"),
    [
        ([], "8", 8 + 30 + 5 + 5),
        (["--drain-delay", "12.5", "--grace-period", "20"], "12.5", 43),
        # The user's variables win over the options, in the runtime and in the pod's grace.
        (["--drain-delay", "3", "-e", "ABEJA_RUNTIME_DRAIN_DELAY=40"], "40", 40 + 30 + 5 + 5),
    ],
    ids=["defaults", "options", "-e"],
)
def test_a_stopping_pod_drains_in_the_runtime_without_a_pre_stop_pause(
    tmp_path: Path, args: list[str], drain: str, grace: int
) -> None:
    """The runtime's drain delay (readiness 503 while it still answers) does what a preStop
    sleep did; the kubelet waits for the delay, the grace period and the kill of stragglers."""
    result, documents = manifests("--image", "m:1", "--target", "kubernetes", *args, cwd=tmp_path)
    assert result.returncode == 0, str(result)
    validate(documents[0])
    pod = documents[0]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert "lifecycle" not in container
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env["ABEJA_RUNTIME_DRAIN_DELAY"] == drain
    assert pod["terminationGracePeriodSeconds"] == grace
    assert grace >= math.ceil(float(drain)) + int(env["ABEJA_RUNTIME_GRACE_PERIOD"]) + 5


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--image", "m:1", "--target", "swarm"], "--target 'swarm' is not one of"),
        (["--image", "Bad Image", "--target", "kserve"], "is not an image name Docker accepts"),
        (["--image", "m:1", "--target", "kserve", "-e", "X"], "-e 'X' has no value"),
        (
            ["--image", "m:1", "--target", "kubernetes", "-e", "ABEJA_RUNTIME_GRACE_PERIOD=soon"],
            "-e ABEJA_RUNTIME_GRACE_PERIOD=soon: the value must be a number of seconds, 0 or more "
            "(e.g. 2.5; 0: no limit); give one that is, or --grace-period instead",
        ),
        (  # whatever the target sizes: the runtime would refuse it at its start
            ["--image", "m:1", "--target", "kubernetes", "-e", "ABEJA_RUNTIME_WORKERS=0"],
            "-e ABEJA_RUNTIME_WORKERS=0: the value must be a whole number, 1 or more; give one "
            "that is, or --workers instead",
        ),
        (
            ["--image", "m:1", "--target", "knative", "--drain-delay", "inf"],
            "--drain-delay inf is not a finite number: the pod's termination grace period and "
            "timeouts are sized by it",
        ),
        (["--image", "m:1", "--target", "kserve", "--name", "9x"], "is not a Kubernetes name"),
        (["--image", "m:1", "--target", "kserve", "--env-file", "nope.env"], "does not exist"),
        (
            ["--image", "m:1", "--target", "knative", "--autoscaler", "keda"],
            "--autoscaler keda is for --target kubernetes; knative scales on the requests in "
            "flight itself (containerConcurrency and the Knative target)",
        ),
        (
            ["--image", "m:1", "--target", "kubernetes", "--autoscaler", "vpa"],
            "--autoscaler 'vpa' is not one of hpa, keda",
        ),
        (
            ["--image", "m:1", "--target", "kubernetes", "--prometheus", "http://p:9090"],
            "--prometheus names the server KEDA asks for the queued requests; add --autoscaler "
            "keda, or leave it out",
        ),
        (
            [
                "--image",
                "m:1",
                "--target",
                "kubernetes",
                "--autoscaler",
                "keda",
                "--prometheus",
                "prometheus:9090",
            ],
            "--prometheus 'prometheus:9090' is not a URL; write it like "
            "http://prometheus-server.monitoring.svc",
        ),
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
