"""The identity model, answering with seldon-core's own ``SeldonResponse``, tagged with the
releases it runs with, and reporting one Seldon metric of each kind (``metrics()``'s COUNTER,
the response's GAUGE and TIMER): it loads only where seldon-core is installed."""

from importlib.metadata import version

from seldon_core.user_model import SeldonResponse

#: What pip installed where this model runs.
RELEASES = {
    "seldon_core": version("seldon-core"),
    "protobuf": version("protobuf"),
    "click": version("click"),
    "prometheus_client": version("prometheus-client"),
}


class Identity:
    def predict(self, X, features_names=None):
        metrics = [
            {"type": "GAUGE", "key": "temperature", "value": 21.5, "tags": {"room": "a"}},
            {"type": "TIMER", "key": "inference", "value": 1.5},
        ]
        return SeldonResponse(X, tags=RELEASES, metrics=metrics)

    def metrics(self):
        return [{"type": "COUNTER", "key": "predictions", "value": 1}]
