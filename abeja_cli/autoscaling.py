"""How the pods that ``abeja model manifests`` describes scale, and on which of the runtime's
signals.

* A CPU-bound model keeps its CPUs busy: a HorizontalPodAutoscaler on CPU utilisation (70 %).
* A model that waits on a GPU keeps its pod full while its CPUs idle: KEDA on the runtime's
  queued requests, summed over the Deployment's pods (``--autoscaler keda``).
* On Knative the autoscaler counts requests in flight itself: ``containerConcurrency`` =
  workers x concurrency is the hard limit, the ``target`` about 70 % of it, written out (KServe
  on Knative gets Knative's default, the same 70 % of containerConcurrency unless the cluster
  changed it).
"""

from __future__ import annotations

from typing import Any, Final, Protocol

from abeja_cli.errors import InputError

__all__ = [
    "AUTOSCALERS",
    "DEFAULT_PROMETHEUS",
    "QUEUED_METRIC",
    "Deployment",
    "check_autoscaler",
    "horizontal_pod_autoscaler",
    "knative_annotations",
    "scaled_object",
    "target_concurrency",
]


class Deployment(Protocol):
    """What scaling reads of a deployment (``manifests.py``'s): its name, its replicas, the
    calls a pod serves at once, and where Prometheus answers KEDA."""

    @property
    def name(self) -> str: ...

    @property
    def replicas(self) -> int: ...

    @property
    def max_replicas(self) -> int: ...

    @property
    def prometheus(self) -> str: ...

    @property
    def pod_concurrency(self) -> int: ...


#: How a Deployment scales: a HorizontalPodAutoscaler on CPU, or KEDA on queued requests.
AUTOSCALERS: Final = ("hpa", "keda")
#: Where KEDA asks for the queued requests by default: the server of the prometheus-community
#: chart (whose pod scraping honours the pods' ``prometheus.io`` annotations), installed as
#: release ``prometheus`` in namespace ``monitoring``.
DEFAULT_PROMETHEUS: Final = "http://prometheus-server.monitoring.svc"
#: The gauge KEDA scales on (``abeja_runtime.metrics``): calls waiting for a handler slot.
QUEUED_METRIC: Final = "abeja_runtime_queued_requests"
#: The share of what a pod can take that the autoscalers aim to keep busy: headroom for a
#: burst while new pods start (the HPA's usual 70 %, Knative's default share).
_UTILIZATION: Final = 0.7


def target_concurrency(pod_concurrency: int) -> int:
    """Requests in flight per pod that Knative's autoscaler aims at: about 70 % of what the
    pod takes at once, at least 1."""
    return max(1, round(_UTILIZATION * pod_concurrency))


def knative_annotations(d: Deployment) -> dict[str, str]:
    """The revision's scale bounds and target. The target is the soft limit (containerConcurrency
    stays the hard one); Knative would take a share of it again (70 % by default), so the
    utilisation is 100 %: the target is that share already."""
    return {
        "autoscaling.knative.dev/min-scale": str(d.replicas),
        "autoscaling.knative.dev/max-scale": str(d.max_replicas),
        "autoscaling.knative.dev/target": str(target_concurrency(d.pod_concurrency)),
        "autoscaling.knative.dev/target-utilization-percentage": "100",
    }


def horizontal_pod_autoscaler(d: Deployment, labels: dict[str, str]) -> dict[str, Any]:
    """On CPU, for a model that keeps its CPUs busy."""
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": d.name, "labels": labels},
        "spec": {
            "scaleTargetRef": _scale_target(d),
            "minReplicas": d.replicas,
            "maxReplicas": d.max_replicas,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {
                        "name": "cpu",
                        "target": {
                            "type": "Utilization",
                            "averageUtilization": round(_UTILIZATION * 100),
                        },
                    },
                }
            ],
        },
    }


def scaled_object(d: Deployment, labels: dict[str, str]) -> dict[str, Any]:
    """KEDA, on the calls that wait for a handler slot, summed over the Deployment's pods.

    KEDA wants as many pods as the sum divided by the threshold, so the pods settle where
    about one call waits per handler slot of each (workers x concurrency): queued calls grow
    steeply as a pod nears its capacity, and are a signal where CPU stays low."""
    # The pods' labels as Prometheus's pod scraping writes them (labelmap: dots and slashes
    # become underscores).
    query = f'sum({QUEUED_METRIC}{{app_kubernetes_io_name="{d.name}"}})'
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": d.name, "labels": labels},
        "spec": {
            "scaleTargetRef": _scale_target(d),
            "minReplicaCount": d.replicas,
            "maxReplicaCount": d.max_replicas,
            "triggers": [
                {
                    "type": "prometheus",
                    "metadata": {
                        "serverAddress": d.prometheus,
                        "query": query,
                        "threshold": str(d.pod_concurrency),
                    },
                }
            ],
        },
    }


def _scale_target(d: Deployment) -> dict[str, str]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "name": d.name}


def check_autoscaler(target: str, autoscaler: str, prometheus: str | None) -> None:
    """``--autoscaler`` and ``--prometheus`` fit ``--target`` and each other."""
    if autoscaler == "keda" and target != "kubernetes":
        raise InputError(
            f"--autoscaler keda is for --target kubernetes; {target} scales on the requests in "
            "flight itself (containerConcurrency and the Knative target)"
        )
    if prometheus is not None and autoscaler != "keda":
        raise InputError(
            "--prometheus names the server KEDA asks for the queued requests; add --autoscaler "
            "keda, or leave it out"
        )
    if prometheus is not None and not prometheus.startswith(("http://", "https://")):
        raise InputError(
            f"--prometheus {prometheus!r} is not a URL; write it like {DEFAULT_PROMETHEUS}"
        )
