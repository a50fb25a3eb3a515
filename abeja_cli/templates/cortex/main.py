"""A Cortex request handler (Cortex's iris example) in front of the ONNX model iris.onnx.

The runtime runs the model with onnxruntime; these two functions shape its input and output.
Replace iris.onnx with your model (or set --cortex-model), and adapt both functions to it.
"""

import numpy as np  # noqa: F401 - pre-installed in Cortex's images, as in Cortex's examples

labels = ["iris-setosa", "iris-versicolor", "iris-virginica"]


def pre_inference(sample, signature, metadata):
    # The model's one input, from the JSON request: a flat list of the four measurements.
    return {
        signature[0].name: [
            sample["sepal_length"],
            sample["sepal_width"],
            sample["petal_length"],
            sample["petal_width"],
        ]
    }


def post_inference(prediction, signature, metadata):
    # The model's first output is the class id: answer its name.
    predicted_class_id = prediction[0][0]
    return labels[predicted_class_id]
