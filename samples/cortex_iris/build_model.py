"""Build ``iris.onnx``: a tiny linear iris classifier written directly as an ONNX graph.

No training and no download: petal length alone decides (setosa below 3 cm, virginica above
5.25 cm, versicolor between), which is enough for the classic examples. Needs ``onnx``.

    python build_model.py [iris.onnx]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: Rows: sepal length, sepal width, petal length, petal width; columns: the three classes.
WEIGHTS = np.array([[0, 0, 0], [0, 0, 0], [-2, 0, 2], [0, 0, 0]], dtype=np.float32)
BIAS = np.array([6, 0, -10.5], dtype=np.float32)


def build(path: Path, *, label_first: bool = True) -> Path:
    """Write the model; outputs ``label`` (int64) and ``probabilities``, in that order or not.

    Cortex's newer iris handler reads the label from the first output, the older one the
    probabilities, so each test model puts the one its handler expects first.
    """
    nodes = [
        helper.make_node("MatMul", ["input", "weights"], ["scores"]),
        helper.make_node("Add", ["scores", "bias"], ["logits"]),
        helper.make_node("ArgMax", ["logits"], ["label"], axis=1, keepdims=0),
        helper.make_node("Softmax", ["logits"], ["probabilities"], axis=1),
    ]
    label = helper.make_tensor_value_info("label", TensorProto.INT64, ["batch"])
    probabilities = helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", 3])
    graph = helper.make_graph(
        nodes,
        "iris",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 4])],
        [label, probabilities] if label_first else [probabilities, label],
        initializer=[
            numpy_helper.from_array(WEIGHTS, "weights"),
            numpy_helper.from_array(BIAS, "bias"),
        ],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="abeja-runtime"
    )
    model.ir_version = 8  # readable by onnxruntime releases of several years
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


if __name__ == "__main__":
    print(build(Path(sys.argv[1] if len(sys.argv) > 1 else "iris.onnx")))
