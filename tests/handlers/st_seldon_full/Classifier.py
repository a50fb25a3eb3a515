"""A Seldon component using every optional method the Python wrapper knows."""

import numpy as np


class SeldonResponse:
    """The shape of seldon_core.user_model.SeldonResponse (data + runtime tags and metrics)."""

    def __init__(self, data, tags=None, metrics=None):
        self.data = data
        self.tags = tags or {}
        self.metrics = metrics or []


class Classifier:
    def __init__(self):
        self.loaded = False
        self.calls = 0

    def load(self):
        self.loaded = True
        self.weights = np.array([[1.0, -1.0], [0.5, 0.5]])

    def predict(self, X, features_names, meta=None):
        self.calls += 1
        if isinstance(X, dict):  # jsonData
            return {"echo": X, "names": features_names, "meta": meta}
        if isinstance(X, str):  # strData
            return X.upper()
        if isinstance(X, bytes):  # binData
            return X[::-1]
        if X.size and X.flat[0] == -1:
            raise ValueError("negative one is not a feature")
        if X.size and X.flat[0] == -2:
            return SeldonResponse(X, tags={"runtime": "tag"}, metrics=[{"key": "bad"}])
        if X.size and X.flat[0] == -3:
            return SeldonResponse(
                X, tags={"runtime": "tag"}, metrics=[{"type": "TIMER", "key": "t", "value": 1.5}]
            )
        if X.size and X.flat[0] == -4:
            gauge = {"type": "GAUGE", "key": "temperature", "value": 21.5, "tags": {"room": "a"}}
            return SeldonResponse(X, metrics=[gauge])
        if X.size and X.flat[0] == -5:  # a key reused with another type: skipped, not an error
            return SeldonResponse(X, metrics=[{"type": "GAUGE", "key": "predictions", "value": 1}])
        return X @ self.weights

    def class_names(self):
        return ["low", "high"]

    def tags(self):
        return {"model": "classifier", "loaded": str(self.loaded)}

    def metrics(self):
        return [{"type": "COUNTER", "key": "predictions", "value": 1}]

    def health_status(self):
        return {"calls": self.calls}

    def init_metadata(self):
        return {
            "name": "classifier",
            "versions": ["v1"],
            "inputs": [{"name": "features", "datatype": "FP64", "shape": [2]}],
            "outputs": [{"name": "scores", "datatype": "FP64", "shape": [2]}],
        }

    def transform_input(self, X, features_names, meta=None):
        return X * 10

    def transform_output(self, X, features_names):
        return X + 1
