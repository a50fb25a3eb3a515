"""The ``kserve`` style: a ``kserve.Model`` subclass, served with KServe's V1 and V2 (Open
Inference) REST protocols (:mod:`.adapter`), V2 gRPC on ``--grpc-port`` (:mod:`.grpc_service`),
and KServe's ``python model.py`` habit (:mod:`.script`, ``abeja-runtime kserve``: :mod:`.command`).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final

from abeja_runtime.errors import HandlerLoadError
from abeja_runtime.settings import setting
from abeja_runtime.styles import (
    Choice,
    ClassStyle,
    LoadedHandler,
    Target,
    class_named_like,
    defined_classes,
)

if TYPE_CHECKING:
    from abeja_runtime.config import Config

__all__ = ["STYLE", "KserveOptions", "is_kserve_model"]

#: kserve's base classes; a class deriving from one of them is a KServe model.
_BASES: Final = frozenset({"Model", "BaseKServeModel", "InferenceModel"})


@dataclass(frozen=True)
class KserveOptions:
    model_name: str = setting(
        "model",
        kind="text",
        envvar="ABEJA_RUNTIME_MODEL_NAME",
        help="KServe: the model's name in `/v1/models/NAME` and `/v2/models/NAME` (KServe's "
        "`--model_name`)",
    )
    #: ``abeja-runtime kserve model.py ...``: the model file and its arguments, run as
    #: ``__main__``; empty: HANDLER is imported as usual.
    kserve_script: tuple[str, ...] = ()
    #: KServe's ``--enable_docs_url``: ``/docs`` serves the Swagger UI of ``/openapi.json``.
    kserve_docs: bool = False

    def __post_init__(self) -> None:
        if not self.model_name or "/" in self.model_name:
            raise ValueError(f"model name must be non-empty without '/', got {self.model_name!r}")


class _Kserve(ClassStyle):
    name = "kserve"
    options = KserveOptions
    expected = "a kserve.Model subclass (or an instance of one)"

    def detect(self, target: Target) -> Choice | None:
        if target.obj is Target.MISSING:
            return self.in_module(target.module)
        if is_kserve_model(target.obj):
            return Choice(self, f"{target.attribute} is a kserve.Model", target.obj)
        return None

    def serves(self, obj: Any) -> bool:
        return is_kserve_model(obj)

    def in_module(self, module: ModuleType) -> Choice | None:
        named = class_named_like(module)
        model = named if named is not None and is_kserve_model(named) else _only_model(module)
        if model is None:
            return None
        return Choice(self, f"{module.__name__}.{model.__name__} is a kserve.Model", model)

    def load_itself(
        self, config: Config, options: KserveOptions, workdir: Path
    ) -> LoadedHandler | None:
        if not options.kserve_script:
            return None
        from abeja_runtime.styles.kserve.script import load_script

        return load_script(config, options, workdir)

    def load(
        self, subject: Any, config: Config, options: KserveOptions, workdir: Path
    ) -> LoadedHandler:
        from abeja_runtime.styles.kserve.adapter import adapt

        return adapt(subject, config=config, options=options, workdir=workdir)


def is_kserve_model(obj: Any) -> bool:
    """True for a subclass (or instance) of kserve's Model, without importing kserve."""
    cls = obj if inspect.isclass(obj) else type(obj)
    return any(
        base.__name__ in _BASES and base.__module__.partition(".")[0] == "kserve"
        for base in cls.__mro__[1:]
    )


def _only_model(module: ModuleType) -> type | None:
    models = defined_classes(module, is_kserve_model)
    if len(models) > 1:
        names = ", ".join(sorted(model.__name__ for model in models))
        raise HandlerLoadError(
            f"{module.__name__} defines several kserve.Model classes ({names}); name the one "
            f"to serve in HANDLER, e.g. {module.__name__}:{models[0].__name__}"
        )
    return models[0] if models else None


STYLE = _Kserve()
