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
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from abeja_runtime import styles
from abeja_runtime.config import Config
from abeja_runtime.errors import HandlerLoadError, handler_format_message
from abeja_runtime.styles import LoadedHandler, module_alone_allowed

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
    if config.style != "auto":
        style = styles.style_named(config.style)
        handler = style.load_itself(config, config.options_of(style), workdir)
        if handler is not None:
            return handler
    module_name, attribute = _parse_spec(spec, config.style)
    with _argv_of_its_own():
        module, attribute = _import_target(module_name, attribute, spec)
        target = styles.Target(spec=spec, module=module, attribute=attribute)
        choice = styles.choose(target, config.style)
        handler = choice.style.load(
            choice.subject, config, config.options_of(choice.style), workdir
        )
    _log.info(
        "serving HANDLER[%s] with the %s style (%s)",
        spec,
        choice.style.name,
        choice.reason,
        extra={"fields": {"style": choice.style.name}},
    )
    return handler


def _parse_spec(spec: str, style: str) -> tuple[str, str]:
    module_name, sep, attribute = spec.partition(":")
    if not sep and module_alone_allowed(style) and module_name:
        return module_name, ""
    if not sep or ":" in attribute or not module_name or not attribute:
        raise HandlerLoadError(handler_format_message(spec))
    return module_name, attribute


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
