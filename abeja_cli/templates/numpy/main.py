"""A numpy model: reads {"inputs": [[...], ...]}, answers {"outputs": [...]} (a linear layer).

The weights are made here from a fixed seed; a trained model would load them at import time
from ABEJA_TRAINING_RESULT_DIR, e.g. np.load(os.path.join(os.environ[...], "model.npz")).
"""

import json

import numpy as np

_RNG = np.random.default_rng(0)
WEIGHTS = _RNG.normal(size=(3, 2))
BIAS = np.zeros(2)


def handler(request, context):
    inputs = np.asarray(json.load(request)["inputs"], dtype=float)
    if inputs.ndim != 2 or inputs.shape[1] != WEIGHTS.shape[0]:
        return {
            "status_code": 400,
            "content_type": "application/json",
            "content": {"error": f"inputs must be rows of {WEIGHTS.shape[0]} numbers"},
        }
    outputs = inputs @ WEIGHTS + BIAS
    return {
        "status_code": 200,
        "content_type": "application/json",
        "content": {"outputs": outputs.round(4).tolist()},
    }
