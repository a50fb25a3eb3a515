"""TensorFlow's ``TensorProto`` in its protobuf JSON form, with numpy only (Seldon's ``tftensor``).

seldon-core reads a request's ``data.tftensor`` with ``tf.make_ndarray`` and answers a numeric
result in the same form with ``tf.make_tensor_proto``; this module does both the way they do,
so the Seldon style needs no TensorFlow:

* :func:`to_array`: the values from ``tensorContent`` (raw little-endian bytes, base64) or from
  the typed list (``floatVal``, ``intVal``, ...); one value for a larger shape fills it, none
  gives zeros; ``halfVal`` holds float16 bit patterns, ``stringVal`` base64 bytes;
* :func:`from_array`: ``tensorContent`` for numeric types of more than one element, the typed
  list otherwise (and always for bools and strings), 64-bit integers as decimal strings and
  float32 values in their shortest form, as protobuf's JSON printer writes them.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["TensorError", "from_array", "to_array"]


class TensorError(ValueError):
    """A ``tftensor`` that does not describe a tensor (the message says what is wrong)."""


@dataclass(frozen=True)
class _Type:
    name: str  # TensorFlow's DataType, e.g. DT_FLOAT
    numpy: str  # the numpy dtype
    field: str  # the typed list of values in the JSON form
    content: bool  # written as tensorContent when it has more than one element


_TYPES: Final = (
    _Type("DT_FLOAT", "float32", "floatVal", True),
    _Type("DT_DOUBLE", "float64", "doubleVal", True),
    _Type("DT_HALF", "float16", "halfVal", True),
    _Type("DT_INT8", "int8", "intVal", True),
    _Type("DT_INT16", "int16", "intVal", True),
    _Type("DT_INT32", "int32", "intVal", True),
    _Type("DT_UINT8", "uint8", "intVal", True),
    _Type("DT_UINT16", "uint16", "intVal", False),
    _Type("DT_INT64", "int64", "int64Val", True),
    _Type("DT_UINT32", "uint32", "uint32Val", True),
    _Type("DT_UINT64", "uint64", "uint64Val", True),
    _Type("DT_BOOL", "bool", "boolVal", False),
    _Type("DT_STRING", "object", "stringVal", False),
)
_BY_NAME: Final = {kind.name: kind for kind in _TYPES}
_BY_NUMPY: Final = {kind.numpy: kind for kind in _TYPES if kind.numpy != "object"}


def to_array(tensor: Any, np: Any) -> Any:
    """The numpy array of a ``tftensor`` (``np`` is numpy, imported by the style)."""
    if not isinstance(tensor, dict):
        raise TensorError(f"tftensor must be an object, got {type(tensor).__name__}")
    kind = _BY_NAME.get(str(tensor.get("dtype", "DT_INVALID")))
    if kind is None:
        known = ", ".join(_BY_NAME)
        raise TensorError(f"tftensor dtype {tensor.get('dtype')!r} is not one of {known}")
    shape = _shape(tensor.get("tensorShape") or {})
    size = 1
    for dim in shape:
        size *= dim
    try:
        if "tensorContent" in tensor:
            raw = base64.b64decode(tensor["tensorContent"], validate=True)
            values = np.frombuffer(raw, dtype=np.dtype(kind.numpy).newbyteorder("<"))
        else:
            values = _typed_values(tensor.get(kind.field) or [], kind, np)
    except (binascii.Error, TypeError, ValueError) as exc:
        raise TensorError(f"tftensor values do not fit {kind.name}: {exc}") from None
    if len(values) == 0:
        values = np.zeros(size, dtype=values.dtype)
    elif len(values) == 1 and size != 1:
        values = np.full(size, values[0], dtype=values.dtype)
    if len(values) != size:
        raise TensorError(f"tftensor has {len(values)} values for the shape {shape}")
    return values.astype(values.dtype.newbyteorder("=")).reshape(shape)


def from_array(array: Any, np: Any) -> dict[str, Any]:
    """The ``tftensor`` of a numpy array, as ``tf.make_tensor_proto`` and protobuf's JSON."""
    if array.dtype.kind in "SUO":
        kind = _BY_NAME["DT_STRING"]
    else:
        found = _BY_NUMPY.get(array.dtype.name)
        if found is None:
            raise TensorError(f"a {array.dtype} result has no tftensor form")
        kind = found
    tensor: dict[str, Any] = {"dtype": kind.name, "tensorShape": _shape_json(array.shape)}
    if kind.content and array.size > 1:
        data = array.astype(np.dtype(kind.numpy).newbyteorder("<")).tobytes()
        tensor["tensorContent"] = base64.b64encode(data).decode("ascii")
    elif array.size:
        tensor[kind.field] = _json_values(array.ravel(), kind, np)
    return tensor


def _shape(shape: Any) -> list[int]:
    if not isinstance(shape, dict) or not isinstance(shape.get("dim", []), list):
        raise TensorError(f"tftensor tensorShape must be {{'dim': [...]}}, got {shape!r}")
    try:
        return [int(dim.get("size", 0)) for dim in shape.get("dim", [])]
    except (AttributeError, TypeError, ValueError):
        raise TensorError(f"tftensor tensorShape has a bad dim: {shape!r}") from None


def _shape_json(shape: tuple[int, ...]) -> dict[str, Any]:
    if not shape:
        return {}
    return {"dim": [{"size": str(dim)} if dim else {} for dim in shape]}


def _typed_values(values: list[Any], kind: _Type, np: Any) -> Any:
    if kind.name == "DT_STRING":
        return np.array([base64.b64decode(value, validate=True) for value in values], dtype=object)
    if kind.name == "DT_HALF":  # float16 bit patterns
        return np.array(values, dtype=np.uint16).view(np.float16)
    return np.array([_number(value, kind) for value in values], dtype=kind.numpy)


def _number(value: Any, kind: _Type) -> Any:
    if kind.field in ("int64Val", "uint64Val") and isinstance(value, str):
        return int(value)  # 64-bit integers are strings in protobuf's JSON
    return value


def _json_values(values: Any, kind: _Type, np: Any) -> list[Any]:
    if kind.name == "DT_STRING":
        return [
            base64.b64encode(value if isinstance(value, bytes) else str(value).encode()).decode()
            for value in values
        ]
    if kind.name == "DT_HALF":
        return [int(bits) for bits in values.astype(np.float16).view(np.uint16)]
    if kind.field in ("int64Val", "uint64Val"):
        return [str(int(value)) for value in values]
    if kind.name == "DT_FLOAT":  # the shortest text that reads back as the same float32
        return [float(str(np.float32(value))) for value in values]
    return values.tolist()  # type: ignore[no-any-return]
