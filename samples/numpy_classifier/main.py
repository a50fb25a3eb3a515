"""A numpy classifier whose weights come from the training result directory.

On ABEJA Platform, what a training job saved in ``ABEJA_TRAINING_RESULT_DIR`` is unpacked into
that directory for the model; locally it defaults to ``./abejainc_training_result``. The
weights (a softmax regression, made by ``train.py``) are loaded once, at import.

Request: ``{"features": [[sepal_length, sepal_width, petal_length, petal_width], ...]}``.
"""

import http
import json
import os

import numpy as np

_RESULT_DIR = os.environ.get("ABEJA_TRAINING_RESULT_DIR", "abejainc_training_result")
with np.load(os.path.join(_RESULT_DIR, "model.npz"), allow_pickle=False) as _model:
    WEIGHTS = _model["weights"]  # (features, classes)
    BIAS = _model["bias"]  # (classes,)
    MEAN = _model["mean"]  # feature standardisation, from the training data
    SCALE = _model["scale"]
    LABELS = [str(label) for label in _model["labels"]]


def predict(features):
    logits = ((features - MEAN) / SCALE) @ WEIGHTS + BIAS
    logits -= logits.max(axis=1, keepdims=True)
    exp = np.exp(logits)
    return exp / exp.sum(axis=1, keepdims=True)


def handler(request, context):
    try:
        features = np.asarray(json.load(request)["features"], dtype=np.float64)
        if features.ndim != 2 or features.shape[1] != WEIGHTS.shape[0]:
            raise ValueError(f"expected rows of {WEIGHTS.shape[0]} numbers")
    except (KeyError, TypeError, ValueError) as exc:
        return {
            "status_code": http.HTTPStatus.BAD_REQUEST,
            "content_type": "application/json",
            "content": {"message": f"send {{'features': [[...], ...]}}: {exc}"},
        }
    probabilities = predict(features)
    predictions = [
        {
            "label": LABELS[int(row.argmax())],
            "probability": round(float(row.max()), 4),
            "probabilities": {
                label: round(float(p), 4) for label, p in zip(LABELS, row, strict=True)
            },
        }
        for row in probabilities
    ]
    return {
        "status_code": http.HTTPStatus.OK,
        "content_type": "application/json",
        "content": {"predictions": predictions},
    }
