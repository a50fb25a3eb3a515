"""Importing the user's handler (contract A4 / Part B 4), in each handler process.

``load_handler`` runs on the thread that will call the handler: it imports the module (from
the working directory that :mod:`abeja_runtime.project` settled), lets
:mod:`abeja_runtime.styles` decide the handler's style (ABEJA, ABEJA v1, Cortex, KServe,
Seldon) and adapt it, and logs the choice. Every failure is a :class:`HandlerLoadError` whose
message keeps ABEJA's wording (typos fixed) and adds what to do.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from abeja_runtime import styles
from abeja_runtime.config import MODULE_ONLY_STYLES, Config
from abeja_runtime.errors import HandlerLoadError
from abeja_runtime.handler import LoadedHandler

__all__ = ["load_handler"]

_log = logging.getLogger("abeja_runtime")


def load_handler(spec: str, workdir: Path, config: Config | None = None) -> LoadedHandler:
    """Import ``HANDLER`` from the working directory and adapt it to its style.

    ``spec`` is ``module:attribute``, or a module alone where the style allows it (a Cortex
    request-handler file, a Seldon ``MyModel`` module). The choice is logged once per worker.
    """
    config = config if config is not None else Config(handler=spec)
    if str(workdir) not in sys.path:
        sys.path.insert(0, str(workdir))
    if config.kserve_script:
        return _load_kserve_script(config, workdir)
    module_name, attribute = _parse_spec(spec, config.style)
    with _argv_of_its_own():
        module, attribute = _import_target(module_name, attribute, spec)
        target = styles.Target(spec=spec, module=module, attribute=attribute)
        choice = styles.choose(target, config.style)
        if choice.style in ("abeja", "abeja-v1"):
            handler = _abeja_handler(target)  # the same checks for both generations
            if choice.style == "abeja-v1":
                handler = styles.adapt(choice, handler.func, config, workdir)
        else:
            handler = styles.adapt(choice, choice.subject, config, workdir)
    _log.info(
        "serving HANDLER[%s] with the %s style (%s)",
        spec,
        choice.style,
        choice.reason,
        extra={"fields": {"style": choice.style}},
    )
    return handler


def _load_kserve_script(config: Config, workdir: Path) -> LoadedHandler:
    """``abeja-runtime kserve model.py ...``: the model that the script starts."""
    from abeja_runtime.styles import kserve
    from abeja_runtime.styles.kserve_script import run_main_script

    started = run_main_script(config.kserve_script, workdir)
    handler = kserve.adapt(
        started.model, config=config, workdir=workdir, predictor=started.predictor_config
    )
    _log.info(
        "serving %s with the kserve style (the model its __main__ block starts: %s)",
        config.kserve_script[0],
        type(started.model).__name__,
        extra={"fields": {"style": "kserve"}},
    )
    return handler


def _parse_spec(spec: str, style: str) -> tuple[str, str]:
    module_name, sep, attribute = spec.partition(":")
    if not sep and style in MODULE_ONLY_STYLES and module_name:
        return module_name, ""
    if not sep or ":" in attribute or not module_name or not attribute:
        raise HandlerLoadError(_format_error(spec))
    return module_name, attribute


def _format_error(spec: str) -> str:
    return (
        f"Possibly, your HANDLER[{spec}] parameter is wrong. handler needs one ':' separator. "
        "The format is <module>:<function>, e.g. main:handler."
    )


@contextlib.contextmanager
def _argv_of_its_own() -> Iterator[None]:
    """Hide the runtime's own flags from the user's module while it is imported and set up.

    Code written for other servers parses ``sys.argv`` at import: ``kserve`` does it in
    ``kserve.model_server``, and its docs' examples do it again. Our ``--timeout 2.5`` would be
    read as KServe's ``--timeout-keep-alive`` (an int) and end the worker with SystemExit.
    """
    saved = sys.argv
    sys.argv = saved[:1]
    try:
        yield
    finally:
        sys.argv = saved


def _import_target(module_name: str, attribute: str, spec: str) -> tuple[ModuleType, str]:
    """Import the module; Seldon's ``package.Class`` form is accepted for a module-only spec."""
    if not attribute and "." in module_name:
        parent, _, name = module_name.rpartition(".")
        try:
            return _import(module_name, spec), ""
        except HandlerLoadError as exc:
            cause = exc.__cause__
            if not isinstance(cause, ModuleNotFoundError) or cause.name != module_name:
                raise
            module = _import(parent, spec)
            if not hasattr(module, name):
                raise
            return module, name
    return _import(module_name, spec), attribute


def _abeja_handler(target: Any) -> LoadedHandler:
    """The platform's own ``handler(request, context)``, checked as ABEJA Platform never did."""
    spec, module, func_name = target.spec, target.module, target.attribute
    if not func_name:
        raise HandlerLoadError(
            f"{_format_error(spec)} A module name alone serves a Cortex request handler "
            "(pre_inference/post_inference), a Seldon class named like its module, or a module "
            f"with one kserve.Model class; {module.__name__} has none of them."
        )
    if target.obj is target.MISSING:
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


def _import(module_name: str, spec: str) -> ModuleType:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # Only the HANDLER module (or a package on its path) missing is a HANDLER problem; a
        # package that the module imports, even one whose name is a prefix, is the user's.
        if exc.name is not None and (
            exc.name == module_name or module_name.startswith(exc.name + ".")
        ):
            raise HandlerLoadError(
                f"Couldn't import a module named [{module_name}] specified in HANDLER[{spec}]. "
                "Possibly, your HANDLER parameter or packaging (zip/tar) file structure is wrong. "
                f"{exc} (working directory: {os.getcwd()})"
            ) from exc
        raise HandlerLoadError(
            f"Importing the module [{module_name}] specified in HANDLER[{spec}] failed: {exc}. "
            "Add the missing package to requirements.txt."
        ) from exc
    except Exception as exc:
        raise HandlerLoadError(
            f"Importing the module [{module_name}] specified in HANDLER[{spec}] raised "
            f"{type(exc).__name__}: {exc}"
        ) from exc
