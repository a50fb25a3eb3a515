"""``abeja model manifests``: the YAML that deploys a production image on Kubernetes.

Three targets, one container description (:func:`_container`) shared by all:

* ``kubernetes``: Deployment + Service + an autoscaler (a HorizontalPodAutoscaler on CPU, or a
  KEDA ScaledObject on the runtime's queued requests) + PodDisruptionBudget;
* ``knative``: a Knative Service, ``containerConcurrency`` = workers * concurrency (the hard
  limit), its autoscaling target about 70 % of that;
* ``kserve``: an InferenceService whose predictor is the image as a custom container.

The documents follow the image's contract (images/production.Dockerfile): user 10001,
read-only root filesystem with an ``emptyDir`` on /tmp, readiness on ``/health_check`` and
liveness on ``/livez`` of port 5001, metrics on ``/metrics`` of the same port. A stopping pod
needs no preStop pause: the runtime's drain delay keeps it answering while readiness says 503.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import click

from abeja_cli.autoscaling import (
    AUTOSCALERS,
    DEFAULT_PROMETHEUS,
    check_autoscaler,
    horizontal_pod_autoscaler,
    knative_annotations,
    scaled_object,
)
from abeja_cli.build import check_image_tag
from abeja_cli.console import Console
from abeja_cli.environment import parse_env_file, parse_env_option
from abeja_cli.errors import InputError
from abeja_cli.session import reported
from abeja_runtime.config import VALIDATORS, Config
from abeja_runtime.options import click_option, setting_named

__all__ = ["TARGETS", "Deployment", "manifests", "render"]

TARGETS: Final = ("kubernetes", "knative", "kserve")
_SERVICE_PORT: Final = Config.port
_HEALTH_PORT: Final = Config.healthcheck_port
#: The runtime's settings that the manifests set, from its own declarations.
_PASSED_ON: Final = ("workers", "concurrency", "timeout", "grace_period", "drain_delay")
#: The runtime's batching settings, set only when batching is on (a batch size above 1); a
#: pod then serves up to a batch per handler slot.
_BATCHING: Final = ("max_batch_size", "max_batch_wait")
_DEVICES: Final = str(setting_named("devices").envvar)
_USER: Final = 10001
#: The runtime kills stragglers this long after its grace period (front/serving.py's KILL_MARGIN).
_KILL_MARGIN: Final = 5
#: Seconds beyond the runtime's own bound before the kubelet kills the pod: its last log lines.
_SLACK: Final = 5
_DNS_LABEL: Final = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN: Final = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


@dataclass(frozen=True)
class Deployment:
    """What the manifests describe; validated by :meth:`check`."""

    image: str
    name: str
    env: dict[str, str]
    #: Kubernetes Secrets whose keys become the container's variables (envFrom).
    secrets: tuple[str, ...] = ()
    workers: int = Config.workers
    concurrency: int = Config.concurrency
    timeout: float = Config.timeout
    grace_period: float = Config.grace_period
    drain_delay: float = Config.drain_delay
    max_batch_size: int = Config.max_batch_size
    max_batch_wait: float = Config.max_batch_wait
    replicas: int = 2
    max_replicas: int = 10
    cpu: str = "1"
    memory: str = "1Gi"
    #: NVIDIA GPUs of each pod (``nvidia.com/gpu``).
    gpus: int = 0
    autoscaler: str = "hpa"
    prometheus: str = DEFAULT_PROMETHEUS

    def check(self) -> None:
        if not _DNS_LABEL.match(self.name):
            raise InputError(
                f"--name {self.name!r} is not a Kubernetes name; use lower-case letters, digits "
                "and '-', starting with a letter, at most 63 characters"
            )
        for secret in self.secrets:
            if not _DNS_SUBDOMAIN.match(secret):
                raise InputError(
                    f"--secret {secret!r} is not a Kubernetes Secret name; use lower-case "
                    "letters, digits, '-' and '.'"
                )
        for name in (*_PASSED_ON, *_BATCHING):  # every target sizes something by them
            self.effective(name)
        if not 1 <= self.replicas <= self.max_replicas:
            raise InputError(
                f"--replicas {self.replicas} must be from 1 to --max-replicas {self.max_replicas}"
            )

    @property
    def pod_concurrency(self) -> int:
        """Requests one pod serves at once: what Knative and KServe call containerConcurrency
        (a batch per handler slot)."""
        slots = self.effective("workers") * self.effective("concurrency")
        return int(slots * self.effective("max_batch_size"))

    def effective(self, name: str) -> float:
        """The runtime's setting ``name`` (one of those passed on) as the runtime will read it:
        a variable given with ``-e`` wins over the option (:attr:`runtime_env`), so what the
        manifests size by it (the pod's termination grace, its concurrency, the timeouts)
        follows it. Checked by the runtime's own rule for the setting, and finite (a grace
        period is sized by it): :class:`InputError` otherwise."""
        setting = setting_named(name)
        envvar = str(setting.envvar)
        given = self.env.get(envvar)
        if given is None:
            value = float(getattr(self, name))
            named = f"{setting.flag} {value:g}"
        else:
            named = f"-e {envvar}={given}"
            try:
                value = float(VALIDATORS[setting.kind](setting, given))
            except ValueError as exc:
                raise InputError(
                    f"{named}: the value {exc}; give one that is, or {setting.flag} instead"
                ) from None
        if not math.isfinite(value):
            raise InputError(
                f"{named} is not a finite number: the pod's termination grace period and "
                "timeouts are sized by it"
            )
        return value

    @property
    def runtime_env(self) -> dict[str, str]:
        """The runtime's own settings (its batching ones when batching is on), then the user's
        variables (which win). Several workers share the pod's GPUs, one each, round-robin
        (``--devices``)."""
        passed = (*_PASSED_ON, *_BATCHING) if self.effective("max_batch_size") > 1 else _PASSED_ON
        ours = {str(setting_named(name).envvar): f"{getattr(self, name):g}" for name in passed}
        if self.gpus and self.effective("workers") > 1:
            ours[_DEVICES] = ",".join(str(index) for index in range(self.gpus))
        return {**ours, **self.env}


def default_name(image: str) -> str:
    """``registry.example.com/team/my_model:1`` → ``my-model``."""
    last = image.rsplit("/", 1)[-1].split(":", 1)[0].split("@", 1)[0]
    name = re.sub(r"[^a-z0-9]+", "-", last.lower()).strip("-")
    if not name or not name[0].isalpha():
        name = f"model-{name}".rstrip("-")
    return name[:63].rstrip("-")


def render(target: str, deployment: Deployment) -> list[dict[str, Any]]:
    """The documents of ``target``, in the order ``kubectl apply`` should see them."""
    return {"kubernetes": _kubernetes, "knative": _knative, "kserve": _kserve}[target](deployment)


def _labels(d: Deployment) -> dict[str, str]:
    return {"app.kubernetes.io/name": d.name, "app.kubernetes.io/managed-by": "abeja-runtime"}


def _probe(path: str, port: int | str, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "timeoutSeconds": 2,
        "failureThreshold": failures,
    }


def _add_probes(container: dict[str, Any], port: int | str) -> None:
    """Readiness on /health_check, liveness on /livez, both on the health-check port."""
    container["readinessProbe"] = _probe("/health_check", port, period=5, failures=2)
    container["livenessProbe"] = _probe("/livez", port, period=10, failures=3)


def _container(d: Deployment, *, name: str, ports: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "name": name,
        "image": d.image,
        "ports": ports,
        "env": [{"name": key, "value": value} for key, value in d.runtime_env.items()],
        **(
            {"envFrom": [{"secretRef": {"name": secret}} for secret in d.secrets]}
            if d.secrets
            else {}
        ),
        "resources": _resources(d),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": _USER,
            "runAsGroup": _USER,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }


def _resources(d: Deployment) -> dict[str, Any]:
    """Requests and limits: no CPU limit (throttling hurts tail latency); GPUs, an extended
    resource, with requests equal to limits as Kubernetes requires."""
    gpus = {"nvidia.com/gpu": str(d.gpus)} if d.gpus else {}
    return {
        "requests": {"cpu": d.cpu, "memory": d.memory, **gpus},
        "limits": {"memory": d.memory, **gpus},
    }


def _tmp_volume() -> list[dict[str, Any]]:
    return [{"name": "tmp", "emptyDir": {}}]


def _kubernetes(d: Deployment) -> list[dict[str, Any]]:
    labels = _labels(d)
    selector = {"matchLabels": {"app.kubernetes.io/name": d.name}}
    container = _container(
        d,
        name="model",
        ports=[
            {"name": "http", "containerPort": _SERVICE_PORT},
            {"name": "health", "containerPort": _HEALTH_PORT},
        ],
    )
    _add_probes(container, "health")
    # What the runtime takes at most to stop: its drain delay (answering while readiness
    # says 503, so that endpoints and load balancers stop sending first), the grace period,
    # the kill of stragglers.
    grace = (
        math.ceil(d.effective("drain_delay"))
        + math.ceil(d.effective("grace_period"))
        + _KILL_MARGIN
        + _SLACK
    )
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": d.name, "labels": labels},
        "spec": {
            "replicas": d.replicas,
            "selector": selector,
            # A new pod is ready before an old one goes: no capacity is lost while rolling.
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
            },
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(_HEALTH_PORT),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": {
                    "terminationGracePeriodSeconds": grace,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": _USER,
                        "runAsGroup": _USER,
                        "fsGroup": _USER,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [container],
                    "volumes": _tmp_volume(),
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": d.name, "labels": labels},
        "spec": {
            "selector": selector["matchLabels"],
            "ports": [{"name": "http", "port": 80, "targetPort": "http"}],
        },
    }
    scaler = scaled_object if d.autoscaler == "keda" else horizontal_pod_autoscaler
    autoscaler = scaler(d, labels)
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": d.name, "labels": labels},
        "spec": {"maxUnavailable": 1, "selector": selector},
    }
    return [deployment, service, autoscaler, budget]


def _knative(d: Deployment) -> list[dict[str, Any]]:
    # Knative routes to one port and probes it; the service port answers /health_check too.
    container = _container(
        d, name="model", ports=[{"name": "http1", "containerPort": _SERVICE_PORT}]
    )
    container["readinessProbe"] = _probe("/health_check", _SERVICE_PORT, period=5, failures=2)
    spec: dict[str, Any] = {
        "containerConcurrency": d.pod_concurrency,
        "containers": [container],
        "volumes": _tmp_volume(),
    }
    if timeout := d.effective("timeout"):
        spec["timeoutSeconds"] = math.ceil(timeout)
    return [
        {
            "apiVersion": "serving.knative.dev/v1",
            "kind": "Service",
            "metadata": {"name": d.name, "labels": _labels(d)},
            "spec": {
                "template": {
                    "metadata": {"annotations": knative_annotations(d)},
                    "spec": spec,
                }
            },
        }
    ]


def _kserve(d: Deployment) -> list[dict[str, Any]]:
    container = _container(
        d, name="kserve-container", ports=[{"containerPort": _SERVICE_PORT, "protocol": "TCP"}]
    )
    _add_probes(container, _HEALTH_PORT)
    predictor: dict[str, Any] = {
        "minReplicas": d.replicas,
        "maxReplicas": d.max_replicas,
        "containerConcurrency": d.pod_concurrency,
        "containers": [container],
        "volumes": _tmp_volume(),
    }
    if timeout := d.effective("timeout"):
        predictor["timeout"] = math.ceil(timeout)
    return [
        {
            "apiVersion": "serving.kserve.io/v1beta1",
            "kind": "InferenceService",
            "metadata": {
                "name": d.name,
                "labels": _labels(d),
                "annotations": {"serving.kserve.io/enable-prometheus-scraping": "true"},
            },
            "spec": {"predictor": predictor},
        }
    ]


@click.command("manifests")
@click.option("--image", required=True, metavar="NAME[:TAG]", help="The image to deploy.")
@click.option(
    "--target",
    required=True,
    metavar="|".join(TARGETS),
    help="kubernetes (Deployment, Service, HPA or KEDA ScaledObject, PDB), knative (Service) "
    "or kserve (InferenceService).",
)
@click.option("--name", default=None, help="Name of the resources  [default: from the image]")
@click.option(
    "-e", "--environment", multiple=True, metavar="KEY=VALUE", help="Variable for the model."
)
@click.option("--env-file", type=click.Path(dir_okay=False), default=None, help="Dotenv file.")
@click.option(
    "--secret",
    "secrets",
    multiple=True,
    metavar="NAME",
    help="A Kubernetes Secret whose keys become the model's variables (tokens, passwords: "
    "never in -e, whose values are written into the YAML); repeatable.",
)
@click.option("--replicas", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--max-replicas", type=click.IntRange(min=1), default=10, show_default=True)
@click.option("--cpu", default="1", show_default=True, help="CPU request of each replica.")
@click.option("--memory", default="1Gi", show_default=True, help="Memory of each replica.")
@click.option(
    "--gpus",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="NVIDIA GPUs of each replica (nvidia.com/gpu); several workers share them, one each "
    "(ABEJA_RUNTIME_DEVICES).",
)
@click.option(
    "--autoscaler",
    default="hpa",
    show_default=True,
    metavar="|".join(AUTOSCALERS),
    help="kubernetes: a HorizontalPodAutoscaler on CPU, or a KEDA ScaledObject on the queued "
    "requests (for a model that waits on a GPU, whose CPU stays low).",
)
@click.option(
    "--prometheus",
    default=None,
    metavar="URL",
    help=f"With --autoscaler keda: the Prometheus server that KEDA asks  [default: "
    f"{DEFAULT_PROMETHEUS}]",
)
@click.option("--output", type=click.Path(dir_okay=False), default=None, help="Write to a file.")
def manifests(**params: Any) -> None:
    """Print the YAML that deploys an image built by `abeja model build`.

    \b
    abeja model manifests --image registry.example.com/mymodel:1 --target kubernetes \\
        | kubectl apply -f -
    """
    console = Console()
    reported(console, lambda: _manifests(params))


# The runtime's own settings, as it declares them (flags only here, before --replicas).
manifests.params[6:6] = [
    click_option(setting_named(name), envvar=False) for name in (*_PASSED_ON, *_BATCHING)
]


def _plain_dumper() -> type[Any]:
    """PyYAML's safe dumper without anchors and aliases: the documents share dicts (the labels,
    the selector), which it would write once as ``&id001`` and then as ``*id001``, valid YAML
    that people and some tools (kustomize patches, a reviewer's eye) read badly."""
    import yaml

    class PlainDumper(yaml.SafeDumper):  # type: ignore[misc,unused-ignore]  # no stubs
        def ignore_aliases(self, data: Any) -> bool:
            return True

    return PlainDumper


def _manifests(params: dict[str, Any]) -> int:
    import yaml

    target = _choice("--target", params["target"], TARGETS)
    autoscaler = _choice("--autoscaler", params["autoscaler"], AUTOSCALERS)
    check_autoscaler(target, autoscaler, params["prometheus"])
    image = check_image_tag(params["image"].strip())
    env: dict[str, str] = {}
    if params["env_file"] is not None:
        env.update(parse_env_file(Path(params["env_file"])))
    env.update(parse_env_option(value) for value in params["environment"])
    deployment = Deployment(
        image=image,
        name=params["name"] or default_name(image),
        env=env,
        secrets=params["secrets"],
        replicas=params["replicas"],
        max_replicas=params["max_replicas"],
        cpu=params["cpu"],
        memory=params["memory"],
        gpus=params["gpus"],
        autoscaler=autoscaler,
        prometheus=params["prometheus"] or DEFAULT_PROMETHEUS,
        **{name: params[name] for name in (*_PASSED_ON, *_BATCHING)},
    )
    deployment.check()
    text = yaml.dump_all(render(target, deployment), Dumper=_plain_dumper(), sort_keys=False)
    if params["output"]:
        Path(params["output"]).write_text(text, encoding="utf-8")
    else:
        click.echo(text, nl=False)
    return 0


def _choice(option: str, value: str, choices: tuple[str, ...]) -> str:
    chosen = value.strip().lower()
    if chosen not in choices:
        raise InputError(f"{option} {value!r} is not one of {', '.join(choices)}")
    return chosen
