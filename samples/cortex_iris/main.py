"""The iris request handler of Cortex's docs, unchanged: a Cortex request handler in front of
the ONNX model iris.onnx (made by build_model.py), run with onnxruntime."""

import numpy as np  # noqa: F401 - as in the docs

labels = ["iris-setosa", "iris-versicolor", "iris-virginica"]


def pre_inference(sample, signature, metadata):
    # Convert the request payload to a flattened list
    return {
        signature[0].name: [
            sample["sepal_length"],
            sample["sepal_width"],
            sample["petal_length"],
            sample["petal_width"],
        ]
    }


def post_inference(prediction, signature, metadata):
    # Respond with a string label
    predicted_class_id = prediction[0][0]
    return labels[predicted_class_id]
