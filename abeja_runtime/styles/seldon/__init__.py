"""The ``seldon`` style: a Seldon Core Python component, a class with ``predict`` and its kin,
served with seldon-core's REST routes (:mod:`.adapter`) and its gRPC services on ``--grpc-port``
(:mod:`.grpc_service`, from the protocol in ``protos/``)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final

from abeja_runtime.settings import setting
from abeja_runtime.styles import (
    Choice,
    ClassStyle,
    LoadedHandler,
    Target,
    class_named_like,
    defined_classes,
)
from abeja_runtime.styles.kserve import is_kserve_model

if TYPE_CHECKING:
    from abeja_runtime.config import Config

__all__ = ["STYLE", "SeldonOptions"]

#: Methods that make a class a Seldon Core component (model or transformer).
_METHODS: Final = (
    "predict",
    "predict_raw",
    "transform_input",
    "transform_output",
    "transform_input_raw",
    "transform_output_raw",
    "route",
    "route_raw",
    "aggregate",
    "aggregate_raw",
    "send_feedback",
    "send_feedback_raw",
)


@dataclass(frozen=True)
class SeldonOptions:
    seldon_parameters: str = setting(
        "",
        kind="text",
        flag="--parameters",
        envvar="PREDICTIVE_UNIT_PARAMETERS",
        default_text="none",
        help="Seldon: constructor parameters, seldon-core's JSON list of "
        '`{"name": ..., "value": "...", "type": ...}` (`INT`, `FLOAT`, `DOUBLE`, `STRING`, '
        "`BOOL`)",
    )
    seldon_metadata: str = setting(
        "",
        kind="text",
        flag="--model-metadata",
        envvar="MODEL_METADATA",
        default_text="none",
        help="Seldon: model metadata (YAML or JSON), under what `init_metadata()` returns",
    )
    seldon_unit_id: str = setting(
        "",
        kind="text",
        flag="--predictive-unit-id",
        envvar="PREDICTIVE_UNIT_ID",
        default_text="none",
        help="Seldon: this unit's id in the inference graph; feedback passes the routing "
        "decision recorded under it to `send_feedback`",
    )
    seldon_unit_image: str = setting(
        "",
        kind="text",
        flag="--predictive-unit-image",
        envvar="PREDICTIVE_UNIT_IMAGE",
        default_text="none",
        help="Seldon: this unit's image, in `meta.requestPath` and the default `/metadata`",
    )
    seldon_service_type: str = setting(
        "MODEL",
        kind="text",
        flag="--service-type",
        envvar=None,  # SERVICE_TYPE is ABEJA Platform's variable (HTTP)
        help="Seldon: seldon-core's service type (`MODEL`, `ROUTER`, `TRANSFORMER`, `COMBINER`, "
        "`OUTPUT_TRANSFORMER`, `OUTLIER_DETECTOR`), checked; each route answers by the methods "
        "the class has, as in seldon-core 1.18. A flag only: `SERVICE_TYPE` is ABEJA "
        "Platform's variable",
    )


class _Seldon(ClassStyle):
    name = "seldon"
    options = SeldonOptions
    expected = "a class with a predict(X, features_names) method (or an instance of one)"

    def detect(self, target: Target) -> Choice | None:
        obj = target.obj
        if obj is Target.MISSING:
            return self.in_module(target.module)
        if _is_component(obj) and (inspect.isclass(obj) or not callable(obj)):
            return Choice(self, f"{target.attribute} has Seldon's {_method(obj)} method", obj)
        return None

    def serves(self, obj: Any) -> bool:
        return _is_component(obj)

    def in_module(self, module: ModuleType) -> Choice | None:
        cls = class_named_like(module)
        if cls is not None and _is_component(cls):
            return Choice(
                self,
                f"{module.__name__}.{cls.__name__} is named like its module and has Seldon's "
                f"{_method(cls)} method",
                cls,
            )
        components = defined_classes(module, _is_component)
        if len(components) != 1:
            return None
        (cls,) = components
        return Choice(
            self,
            f"{module.__name__}.{cls.__name__} is its only class, with Seldon's "
            f"{_method(cls)} method",
            cls,
        )

    def load(
        self, subject: Any, config: Config, options: SeldonOptions, workdir: Path
    ) -> LoadedHandler:
        from abeja_runtime.styles.seldon.adapter import adapt

        return adapt(subject, config=config, options=options, workdir=workdir)


def _is_component(obj: Any) -> bool:
    return not is_kserve_model(obj) and _method(obj) is not None


def _method(obj: Any) -> str | None:
    return next((name for name in _METHODS if callable(getattr(obj, name, None))), None)


STYLE = _Seldon()
