"""A v1 (18.10 image) handler: iterate the decoded inputs, yield one result for each.

Written like ABEJA's public samples (chainer/cats_dogs/predict.py): the runtime decodes each
JPEG/PNG input into an RGB numpy array and sends what the generator yields as JSON. The
"model" here is a stand-in that tells bright pictures from dark ones; put your network there.
"""

import numpy as np
from PIL import Image

img_rows, img_cols = 128, 128


def model(x):
    """Scores for (dark, bright) from the mean pixel value."""
    brightness = float(x.mean()) / 255.0
    return np.array([[1.0 - brightness, brightness]], dtype=np.float32)


def decode_predictions(result):
    categories = {0: "dark", 1: "bright"}
    result_with_labels = [
        {"label": categories[i], "probability": round(score, 4)} for i, score in enumerate(result)
    ]
    return sorted(result_with_labels, key=lambda x: x["probability"], reverse=True)


def handler(_iter, ctx):
    for img in _iter:
        img = Image.fromarray(img)
        img = img.resize((img_rows, img_cols))
        x = np.asarray(img, dtype=np.float32)
        x = np.expand_dims(np.transpose(x, (2, 0, 1)), axis=0)
        result = model(x)[0]
        yield {"result": decode_predictions(result.tolist())}
