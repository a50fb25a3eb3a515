"""The Seldon style's ``tftensor`` codec against TensorFlow's own (what seldon-core calls):
``tf.make_tensor_proto`` + protobuf's JSON for answers, ``tf.make_ndarray`` for requests."""

from __future__ import annotations

import os

import numpy as np
import pytest

from abeja_runtime.styles.tftensor import TensorError, from_array, to_array

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
tf = pytest.importorskip("tensorflow", reason="the codec is checked against TensorFlow's own")
json_format = pytest.importorskip("google.protobuf.json_format")

ARRAYS = [
    np.array([[1.0, 2.0], [3.5, -4.25]]),
    np.array([0.1, 0.2], dtype=np.float32),
    np.array(0.1, dtype=np.float32),  # a scalar: floatVal, shortest form
    np.array([[1.5]], dtype=np.float16),
    np.array([1.5, 2.5], dtype=np.float16),
    np.array([1, 2, 3], dtype=np.int32),
    np.array([7], dtype=np.int32),
    np.array([5], dtype=np.int64),
    np.array([5, -6], dtype=np.int64),
    np.array([1, 2], dtype=np.uint16),
    np.array([1, 2], dtype=np.uint32),
    np.array([9], dtype=np.uint64),
    np.array([1, -2], dtype=np.int8),
    np.array([200, 3], dtype=np.uint8),
    np.array([True, False]),
    np.array([b"ab", b"c"], dtype=object),
    np.zeros((0, 2)),
]


def tensorflows(array: np.ndarray) -> dict:
    return json_format.MessageToDict(tf.make_tensor_proto(array))


@pytest.mark.parametrize("array", ARRAYS, ids=lambda a: f"{a.dtype}{list(a.shape)}")
def test_answers_are_what_tensorflow_writes(array):
    assert from_array(array, np) == tensorflows(array)


@pytest.mark.parametrize("array", ARRAYS, ids=lambda a: f"{a.dtype}{list(a.shape)}")
def test_requests_read_as_tensorflow_reads_them(array):
    tensor = tensorflows(array)
    expected = tf.make_ndarray(json_format.ParseDict(tensor, tf.make_tensor_proto(0).__class__()))
    ours = to_array(tensor, np)
    assert ours.dtype == expected.dtype and ours.shape == expected.shape
    assert ours.tolist() == expected.tolist()


def test_one_value_fills_the_shape_and_none_gives_zeros_as_in_tensorflow():
    proto_type = tf.make_tensor_proto(0).__class__
    for tensor in (
        {"dtype": "DT_FLOAT", "tensorShape": {"dim": [{"size": "3"}]}, "floatVal": [7]},
        {"dtype": "DT_INT64", "tensorShape": {"dim": [{"size": "2"}]}},
    ):
        expected = tf.make_ndarray(json_format.ParseDict(tensor, proto_type()))
        assert to_array(tensor, np).tolist() == expected.tolist()


@pytest.mark.parametrize(
    ("tensor", "message"),
    [
        ({"dtype": "DT_NOPE"}, "tftensor dtype 'DT_NOPE' is not one of DT_FLOAT"),
        ({"dtype": "DT_FLOAT", "tensorShape": {"dim": [{"size": "x"}]}}, "a bad dim"),
        ({"dtype": "DT_FLOAT", "tensorContent": "!!"}, "do not fit DT_FLOAT"),
        (
            {"dtype": "DT_FLOAT", "tensorShape": {"dim": [{"size": "3"}]}, "floatVal": [1, 2]},
            "has 2 values for the shape [3]",
        ),
        ([1, 2], "tftensor must be an object"),
    ],
)
def test_a_bad_tftensor_says_what_is_wrong(tensor, message):
    with pytest.raises(TensorError, match=message.replace("[", r"\[").replace("]", r"\]")):
        to_array(tensor, np)
