"""Importing the user's handler (contract A4 / Part B 4), in each handler process, on the thread
that will call it.

The module is imported from the working directory that :mod:`abeja_runtime.project` settled, and
:mod:`abeja_runtime.styles` decides the handler's style and adapts it. Every failure is a
:class:`HandlerLoadError` whose message keeps ABEJA's wording and adds what to do: for a package
that the module imports and that is not installed, from what ``requirements.txt`` lists.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Final

from abeja_runtime import styles
from abeja_runtime.config import Config
from abeja_runtime.errors import HandlerLoadError, handler_format_message
from abeja_runtime.styles import LoadedHandler, module_alone_allowed

__all__ = ["load_handler"]

_log = logging.getLogger("abeja_runtime")

#: A requirement's name at the start of a ``requirements.txt`` line, followed by what may
#: follow a name (extras, a version, markers, ``@ url``); not a path, URL or option.
_REQUIREMENT: Final = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:$|[\[<>=!~;@(,])")


def load_handler(config: Config) -> LoadedHandler:
    """Import ``HANDLER`` (``module:attribute``, or a module alone where the style allows it:
    a Cortex request-handler file, a Seldon ``MyModel`` module) from the working directory, adapt
    it to its style, and log the choice."""
    spec, workdir = config.handler, Path.cwd()
    if str(workdir) not in sys.path:
        sys.path.insert(0, str(workdir))
    if config.style != "auto":
        style = styles.style_named(config.style)
        handler = style.load_itself(config, style.options_in(config), workdir)
        if handler is not None:
            return handler
    module_name, attribute = _parse_spec(spec, config.style)
    with _argv_of_its_own():
        module, attribute = _import_target(module_name, attribute, spec, workdir, config)
        target = styles.Target(spec=spec, module=module, attribute=attribute)
        choice = styles.choose(target, config.style)
        handler = choice.style.load(
            choice.subject, config, choice.style.options_in(config), workdir
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
    """Hide the runtime's own flags from the user's module while it is imported and set up:
    code written for other servers parses ``sys.argv`` at import (``kserve.model_server`` does),
    and would read our ``--timeout 2.5`` as its own and end the worker with SystemExit."""
    saved = sys.argv
    sys.argv = saved[:1]
    try:
        yield
    finally:
        sys.argv = saved


def _import_target(
    module_name: str, attribute: str, spec: str, workdir: Path, config: Config
) -> tuple[ModuleType, str]:
    """Import the module; Seldon's ``package.Class`` form is accepted for a module-only spec."""
    if not attribute and "." in module_name:
        parent, _, name = module_name.rpartition(".")
        try:
            return _import(module_name, spec, workdir, config), ""
        except HandlerLoadError as exc:
            cause = exc.__cause__
            if not isinstance(cause, ModuleNotFoundError) or cause.name != module_name:
                raise
            module = _import(parent, spec, workdir, config)
            if not hasattr(module, name):
                raise
            return module, name
    return _import(module_name, spec, workdir, config), attribute


def _import(module_name: str, spec: str, workdir: Path, config: Config) -> ModuleType:
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
        advice = _missing_package_advice(exc.name or "", workdir, config.install_requirements)
        raise HandlerLoadError(
            f"Importing the module [{module_name}] specified in HANDLER[{spec}] failed: {exc}. "
            f"{advice}"
        ) from exc
    except Exception as exc:
        raise HandlerLoadError(
            f"Importing the module [{module_name}] specified in HANDLER[{spec}] raised "
            f"{type(exc).__name__}: {exc}"
        ) from exc


def _missing_package_advice(missing: str, workdir: Path, installed_at_start: bool) -> str:
    """What to do about the module ``missing`` that the handler's module imports and that is
    not installed: looked up in ``requirements.txt`` under its own name or a parent package's
    (``google.cloud.storage`` is ``google-cloud-storage``)."""
    listed = _requirements(workdir / "requirements.txt")
    if listed is None:
        return "Add the missing package to requirements.txt."
    install = (
        "pip install -r requirements.txt, or start the runtime with --install-requirements "
        "(ABEJA_RUNTIME_INSTALL_REQUIREMENTS=on), which installs requirements.txt at every start"
    )
    parts = missing.split(".")
    names = (".".join(parts[:length]) for length in range(len(parts), 0, -1))
    entry = next((listed[key] for key in map(_package_key, names) if key in listed), None)
    if entry is None and installed_at_start:
        return (
            f"requirements.txt lists no package named {missing}: add the package that provides "
            "it (its name may differ from the module's, as Pillow provides PIL); "
            "--install-requirements installs it at the next start."
        )
    if entry is None:
        return (
            f"requirements.txt lists no package named {missing}: add the package that provides "
            f"it, and install requirements.txt with {install}. If it is listed under another "
            "name (as Pillow provides PIL), only the install is missing."
        )
    if installed_at_start:
        return (
            f"requirements.txt lists {entry}, which was installed at start "
            f"(--install-requirements), yet no module named {missing} is there: check that "
            f"{entry} is the package that provides it."
        )
    return (
        f"The package {entry} is listed in requirements.txt but is not installed: install it "
        f"with {install}."
    )


def _requirements(path: Path) -> dict[str, str] | None:
    """The packages that a ``requirements.txt`` lists (not its options, paths and URLs), by
    :func:`_package_key`, each as written; ``None`` when the project has none."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    listed: dict[str, str] = {}
    for line in text.splitlines():
        found = _REQUIREMENT.match(re.sub(r"(^|\s)#.*", "", line).strip())
        if found is not None:
            listed.setdefault(_package_key(found[1]), found[1])
    return listed


def _package_key(name: str) -> str:
    """A package's name as PEP 503 compares them (case, ``-``, ``_`` and ``.`` alike)."""
    return re.sub(r"[-_.]+", "-", name).lower()
