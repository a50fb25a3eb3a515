"""The ``cortex`` style: a Cortex request-handler module (``pre_inference`` / ``post_inference``)
in front of an ONNX model or a TensorFlow SavedModel (:mod:`.adapter` loads and runs them)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final

from abeja_runtime.settings import setting
from abeja_runtime.styles import Choice, LoadedHandler, Style, Target

if TYPE_CHECKING:
    from abeja_runtime.config import Config

__all__ = ["STYLE", "CortexOptions"]

_FUNCTIONS: Final = ("pre_inference", "post_inference")


@dataclass(frozen=True)
class CortexOptions:
    cortex_model: str = setting(
        "",
        kind="text",
        envvar="ABEJA_RUNTIME_CORTEX_MODEL",
        default_text="the one `*.onnx` or SavedModel",
        help="Cortex: the ONNX model file or TensorFlow SavedModel directory, relative to the "
        "handler's directory (else the one `*.onnx` file or SavedModel directory in the "
        "training-result or handler directory)",
    )
    cortex_metadata: Mapping[str, Any] = setting(
        kind="json_object",
        envvar="ABEJA_RUNTIME_CORTEX_METADATA",
        default_factory=dict,
        help="Cortex: JSON object passed as `metadata` to `pre_inference` / `post_inference`",
    )


class _Cortex(Style):
    name = "cortex"
    options = CortexOptions
    module_only = True

    def detect(self, target: Target) -> Choice | None:
        obj, module = target.obj, target.module
        if obj is Target.MISSING:
            defined = [name for name in _FUNCTIONS if inspect.isfunction(getattr(module, name, 0))]
            if defined:
                return Choice(self, f"{module.__name__} defines {' and '.join(defined)}", module)
            return None
        if inspect.isfunction(obj) and obj.__name__ in _FUNCTIONS:
            return Choice(self, f"{target.attribute} is a Cortex request-handler function", module)
        return None

    def fit(self, target: Target) -> ModuleType:
        return target.module

    def load(self, subject: Any, config: Config, options: Any, workdir: Path) -> LoadedHandler:
        from abeja_runtime.styles.cortex.adapter import adapt

        return adapt(subject, config=config, options=options, workdir=workdir)


STYLE = _Cortex()
