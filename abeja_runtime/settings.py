"""Settings declared once, next to their owner: a dataclass field whose metadata says how it is set.

The core's settings are the fields of :class:`~abeja_runtime.config.Config`; a style's are the
fields of its own options dataclass (:mod:`abeja_runtime.styles`). Each is declared with
:func:`setting`: its default, its environment variable, what kind of value it takes and one help
text. From that one declaration come the command line's options
(:mod:`abeja_runtime.options`), the tables of the README and of docs/styles.md
(``scripts/write-options-tables.py``; a test fails when they are stale) and the defaults that
``abeja model manifests`` writes. Nothing here imports click: handler processes unpickle the
settings and need none of it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Final

__all__ = ["KINDS", "Setting", "setting", "settings_of"]

#: What a setting's value is; :mod:`abeja_runtime.options` turns each into a click type.
KINDS: Final = frozenset(
    {
        "text",  # any string
        "port",  # 0..65535 (0: any free port)
        "optional_port",  # 1..65535, or unset (off)
        "positive",  # an integer of at least 1
        "count",  # an integer of at least 0
        "seconds",  # a number of at least 0
        "positive_seconds",  # a number above 0
        "bytes",  # a size: 1048576, 512KiB, 100MiB
        "choice",  # one of ``choices``
        "log_level",  # a level, logrus names accepted
        "json_object",  # a JSON object
        "switch",  # on or off: --NAME on|off (alone: on), as its variable takes it
        "paths",  # files: the flag repeated; the variable's paths separated by os.pathsep
    }
)
_KEY: Final = "abeja_runtime.setting"


@dataclasses.dataclass(frozen=True)
class Setting:
    """One declared setting, as the command line and the docs need it."""

    #: The field's name (the click parameter's name too); set by :func:`settings_of`.
    name: str
    #: ``--max-queue``. Declared empty, it is the field's name with dashes.
    flag: str
    #: The environment variable, or None for a flag only.
    envvar: str | None
    #: The field's default (its factory's value); set by :func:`settings_of`.
    default: Any
    kind: str
    help: str
    #: How the docs and ``--help`` show the default where its value alone would not say it
    #: (``current dir``, ``off``); None: the value, formatted for its kind.
    default_text: str | None
    choices: tuple[str, ...]
    #: A batch run (``abeja-runtime batch``) has no use for it.
    server_only: bool


def setting(
    default: Any = dataclasses.MISSING,
    *,
    kind: str,
    help: str,
    envvar: str | None,
    flag: str | None = None,
    default_factory: Any = dataclasses.MISSING,
    default_text: str | None = None,
    choices: tuple[str, ...] = (),
    server_only: bool = False,
) -> Any:
    """A dataclass field that is a setting. ``flag`` defaults to the field's name with dashes;
    ``help`` is one phrase, Markdown allowed (backticks are dropped in ``--help``)."""
    if kind not in KINDS:
        raise ValueError(f"unknown setting kind {kind!r}")
    declared = Setting("", flag or "", envvar, None, kind, help, default_text, choices, server_only)
    return dataclasses.field(
        default=default, default_factory=default_factory, metadata={_KEY: declared}
    )


def settings_of(cls: type) -> tuple[Setting, ...]:
    """The settings of a dataclass, in the order of its fields."""
    found = []
    for field in dataclasses.fields(cls):
        declared = field.metadata.get(_KEY)
        if declared is None:
            continue
        default = (
            field.default_factory()
            if field.default_factory is not dataclasses.MISSING
            else field.default
        )
        found.append(
            dataclasses.replace(
                declared,
                name=field.name,
                flag=declared.flag or "--" + field.name.replace("_", "-"),
                default=default,
            )
        )
    return tuple(found)
