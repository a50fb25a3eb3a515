"""ABEJA's public v1 image classifier sample (abeja-platform-samples chainer/cats_dogs/predict.py)
with its Chainer network replaced by a numpy stand-in; the handler's code is the sample's."""

import os

import numpy as np
from PIL import Image

num_classes = 2
img_rows, img_cols = 128, 128
ABEJA_TRAINING_RESULT_DIR = os.environ.get("ABEJA_TRAINING_RESULT_DIR", ".")


def model(x):
    """Stand-in for SimpleNet: 'dog' for dark pictures, 'cat' for bright ones."""
    brightness = float(x.mean()) / 255.0
    return np.array([[1.0 - brightness, brightness]], dtype=np.float32)


def preprocess_input(x):
    return x


def decode_predictions(result):
    categories = {0: "dog", 1: "cat"}
    result_with_labels = [
        {"label": categories[i], "probability": score} for i, score in enumerate(result)
    ]
    return sorted(result_with_labels, key=lambda x: x["probability"], reverse=True)


def handler(_iter, ctx):
    for img in _iter:
        img = Image.fromarray(img)
        img = img.resize((img_rows, img_cols))

        x = np.asarray(img)
        x = np.asarray(x, dtype=np.float32)
        x = np.transpose(x, (2, 0, 1))
        x = np.expand_dims(x, axis=0)
        x = preprocess_input(x)

        result = model(x)[0]

        sorted_result = decode_predictions(result.tolist())
        yield {"result": sorted_result}
