"""The cortex_iris sample's model builder (an ONNX iris classifier, made with the ``onnx``
package: no download)."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "cortex_iris"


def _builder() -> Callable[..., Any]:
    spec = importlib.util.spec_from_file_location("iris_build_model", SAMPLE / "build_model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    build: Callable[..., Any] = module.build
    return build


build_model = _builder()
