"""The ``abeja`` style: ABEJA Platform's own ``handler(request, context)``, served as it is.

It comes last in the registry: whatever no other style recognises is an ABEJA handler, and a
HANDLER that names nothing usable gets ABEJA's own error messages (typos fixed) and what to do.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import TYPE_CHECKING, Any

from abeja_runtime.errors import HandlerLoadError, handler_format_message
from abeja_runtime.styles import Choice, LoadedHandler, Style, Target

if TYPE_CHECKING:
    from abeja_runtime.config import Config

__all__ = ["STYLE", "checked_handler"]


class _Abeja(Style):
    name = "abeja"

    def detect(self, target: Target) -> Choice:
        if target.obj is Target.MISSING:
            return Choice(self, "the default: no other style matched", target)
        return Choice(self, f"{target.attribute} is a handler(request, context) callable", target)

    def fit(self, target: Target) -> Target:
        return target

    def load(self, subject: Any, config: Config, options: Any, workdir: Path) -> LoadedHandler:
        return checked_handler(subject)


def checked_handler(target: Target) -> LoadedHandler:
    """The function HANDLER names, checked as ABEJA Platform never did."""
    spec, module, func_name = target.spec, target.module, target.attribute
    if not func_name:
        raise HandlerLoadError(
            f"{handler_format_message(spec)} A module name alone serves a Cortex request handler "
            "(pre_inference/post_inference), a Seldon class named like its module, or a module "
            f"with one kserve.Model class; {module.__name__} has none of them."
        )
    if target.obj is Target.MISSING:
        defined = sorted(
            name
            for name, value in vars(module).items()
            if callable(value)
            and not name.startswith("_")
            and not inspect.isclass(value)
            and getattr(value, "__module__", None) == module.__name__
        )
        raise HandlerLoadError(
            f"Couldn't import a function named [{func_name}] specified in HANDLER[{spec}]. "
            f"Possibly, your HANDLER parameter is wrong. Module {module.__name__} defines: "
            f"{', '.join(defined) or 'no functions'}."
        )
    func = target.obj
    if not callable(func):
        raise HandlerLoadError(
            f"HANDLER[{spec}] names {func_name}, which is a {type(func).__name__}, "
            "not a function; point HANDLER at def handler(request, context)."
        )
    is_async = inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(
        getattr(func, "__call__", None)  # noqa: B004 - callable objects with async __call__
    )
    return LoadedHandler(func=func, is_async=is_async, name=spec)


STYLE = _Abeja()
