"""A scikit-learn classifier, served as ABEJA's table-data template serves one: the model is
loaded at import, each request is ``{"instances": [[feature, ...], ...]}``, the answer
``{"predictions": [class, ...]}``. ``model.joblib`` is written by ``train.py``."""

import json
from pathlib import Path

import joblib

MODEL = joblib.load(Path(__file__).with_name("model.joblib"))


def handler(request, context):
    instances = json.load(request)["instances"]
    return {"predictions": MODEL.predict(instances).tolist()}
