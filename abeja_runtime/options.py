"""The command line's options and the docs' tables, made from the declared settings.

Every setting (:mod:`abeja_runtime.settings`) becomes one click option: its flag, its variable
(click gives the precedence command line > environment > default), a click type for its kind,
and its help; and one row of a Markdown table, in the README for the core's settings and in
docs/styles.md for the styles'. ``scripts/write-options-tables.py`` writes the tables; a test
fails when they differ from what the declarations say. Only the front (the command line)
imports this module: it brings click.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, TypeVar

import click

from abeja_runtime.config import Config, parse_bool, parse_context
from abeja_runtime.settings import Setting, settings_of
from abeja_runtime.styles import Style, registered

__all__ = [
    "click_option",
    "core_settings",
    "markdown_table",
    "passing_option",
    "setting_named",
    "split_options",
    "style_settings",
    "variable_text",
]

#: logrus level names used by ABEJA Platform, mapped onto ours.
_LEVEL_ALIASES: Final = {
    "trace": "debug",
    "warn": "warning",
    "fatal": "critical",
    "panic": "critical",
}
_F = TypeVar("_F", bound=Callable[..., Any])
_UNITS: Final = ((1024**3, "GiB"), (1024**2, "MiB"), (1024, "KiB"))


class _ByteSize(click.ParamType):  # type: ignore[type-arg,unused-ignore]
    """A byte count: ``1048576``, ``512KiB``, ``100MiB``, ``1GiB`` (KB, MB, GB: also 1024-based)."""

    name = "bytes"
    _pattern: Final = re.compile(r"^\s*(\d+)\s*([kmg]i?b?)?\s*$", re.IGNORECASE)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        match = self._pattern.match(str(value))
        if not match:
            self.fail(f"{value!r} is not a size in bytes (e.g. 1048576 or 100MiB)", param, ctx)
        number, unit = match.groups()
        return int(number) * int(1024 ** (" kmg".index(unit[0].lower()) if unit else 0))


class _LogLevel(click.Choice):  # type: ignore[type-arg,unused-ignore]
    def __init__(self, levels: Iterable[str]) -> None:
        super().__init__([*levels, *_LEVEL_ALIASES], case_sensitive=False)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        level = str(super().convert(value, param, ctx)).lower()
        return _LEVEL_ALIASES.get(level, level)


class _Switch(click.ParamType):  # type: ignore[type-arg,unused-ignore]
    """On or off, in the words its variable takes (on/off, true/false, yes/no, 1/0)."""

    name = "switch"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> bool:
        if isinstance(value, bool):
            return value
        try:
            return parse_bool(str(value))
        except ValueError:
            self.fail(
                f"{value!r} is not on or off; give on or off (or true/false, yes/no, 1/0)",
                param,
                ctx,
            )


class _JsonObject(click.ParamType):  # type: ignore[type-arg,unused-ignore]
    name = "json"

    def __init__(self, variable: str) -> None:
        self.variable = variable  # named in error messages

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, Mapping):
            return dict(value)
        try:
            return parse_context(value, self.variable)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


#: Each kind's click type, made for its setting (the choices, the variable named in errors).
_CLICK_TYPES: Final[Mapping[str, Callable[[Setting], Any]]] = {
    "text": lambda setting: click.STRING,
    "port": lambda setting: click.IntRange(0, 65535),
    "optional_port": lambda setting: click.IntRange(1, 65535),
    "positive": lambda setting: click.IntRange(min=1),
    "count": lambda setting: click.IntRange(min=0),
    "seconds": lambda setting: click.FloatRange(min=0),
    "positive_seconds": lambda setting: click.FloatRange(min=0, min_open=True),
    "bytes": lambda setting: _ByteSize(),
    "choice": lambda setting: click.Choice(setting.choices, case_sensitive=False),
    "log_level": lambda setting: _LogLevel(setting.choices),
    "json_object": lambda setting: _JsonObject(setting.envvar or setting.flag),
    "switch": lambda setting: _Switch(),
    "paths": lambda setting: click.Path(dir_okay=False),
}


def _click_type(setting: Setting) -> Any:
    made = _CLICK_TYPES.get(setting.kind)
    if made is None:
        raise AssertionError(f"no click type for the kind {setting.kind!r}")
    return made(setting)


def _format_bytes(size: int) -> str:
    """``104857600`` → ``100MiB``: the unit in which the size is a whole number."""
    for unit, suffix in _UNITS:
        if size and size % unit == 0:
            return f"{size // unit}{suffix}"
    return str(size)


def _shown_default(setting: Setting) -> str:
    """The default as ``--help`` and the docs show it."""
    if setting.default_text is not None:
        return setting.default_text
    value = setting.default
    if setting.kind == "switch":
        return "on" if value else "off"
    if setting.kind == "bytes":
        return _format_bytes(value)
    if setting.kind == "json_object":
        return json.dumps(dict(value))
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _plain(text: str) -> str:
    """Markdown's backticks dropped, the first letter capitalised: a sentence for ``--help``."""
    text = text.replace("`", "")
    return text[:1].upper() + text[1:] + "."


def _value_form(setting: Setting) -> dict[str, Any]:
    """How the option of ``setting`` takes its value: a switch as ``--NAME on|off``, in the
    words of its variable, or ``--NAME`` alone for on; every other kind as its click type."""
    if setting.kind == "switch":
        return {
            "type": _click_type(setting),
            "is_flag": False,
            "flag_value": True,
            "metavar": "[on|off]",
        }
    # Paths: the flag repeated, the variable split at os.pathsep by click.Path.
    return {"type": _click_type(setting), "multiple": setting.kind == "paths"}


def click_option(setting: Setting, *, envvar: bool = True) -> click.Option:
    """The click option of ``setting`` (without its variable where ``envvar`` is false)."""
    default: Any = setting.default
    if setting.kind == "json_object":
        default = default or "{}"
    elif setting.kind in ("bytes", "switch"):
        default = _shown_default(setting)  # shown as it may be written; its type reads it
    shown = setting.default_text
    return click.Option(
        [setting.flag, setting.name],
        envvar=setting.envvar if envvar else None,
        show_envvar=envvar and setting.envvar is not None,
        **_value_form(setting),
        default=default,
        show_default=True if shown is None else shown.replace("`", ""),
        help=_plain(setting.help),
    )


def passing_option(setting: Setting) -> Callable[[_F], _F]:
    """A decorator adding, to another command (``abeja model run-local``), the option that
    passes ``setting`` on as its variable (:func:`variable_text`): unset unless given, so that
    a value given with ``-e`` stays."""
    shown = _shown_default(setting).replace("`", "")
    return click.option(
        setting.flag,
        setting.name,
        **_value_form(setting),
        default=None,
        help=f"{_plain(setting.help)} Sets {setting.envvar}.  [default: {shown}]",
    )


def variable_text(value: Any) -> str:
    """A value of a :func:`passing_option` as its variable takes it: a switch ``on`` or
    ``off``, a float without a trailing ``.0``."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def core_settings() -> tuple[Setting, ...]:
    return settings_of(Config)


def style_settings() -> tuple[tuple[Style, Setting], ...]:
    """Each style's settings, with the style, in the registry's order."""
    return tuple(
        (style, setting)
        for style in registered()
        if style.options is not None
        for setting in settings_of(style.options)
    )


def setting_named(name: str) -> Setting:
    """A core setting by its name (``workers``), for commands that pass it on."""
    return next(setting for setting in core_settings() if setting.name == name)


def split_options(options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Parsed options (``name=value``) → the core's keyword arguments of :class:`Config`, and
    each style's options object by its name (only styles with a value given here: the others
    keep their defaults). A style's option that is not on the command line (KServe's script)
    may be given by name too."""
    core = dict(options)
    styles: dict[str, Any] = {}
    for style in registered():
        if style.options is None:
            continue
        names = {field.name for field in dataclasses.fields(style.options)}
        given = {name: core.pop(name) for name in list(core) if name in names}
        if given:
            styles[style.name] = style.options(**given)
    return core, styles


def markdown_table(rows: Iterable[Setting]) -> str:
    """The table of ``rows``: flag, variable, default, meaning."""
    lines = ["| flag | variable | default | meaning |", "|---|---|---|---|"]
    for setting in rows:
        variable = f"`{setting.envvar}`" if setting.envvar else "(flag only)"
        default = _shown_default(setting)
        if setting.default_text is None:
            default = f"`{default}`"
        lines.append(f"| `{setting.flag}` | {variable} | {default} | {setting.help} |")
    return "\n".join(lines) + "\n"
