"""The base image that the Docker engine builds a model's image on, chosen once.

``-i`` on a command wins; then ``ABEJA_IMAGE`` in the environment (click reads it, as the
option's ``envvar``); then ``ABEJA_IMAGE`` in the project's ``.env``; then the default. Behind a
registry block the default cannot be pulled: one line in ``.env`` (or the shell's profile)
makes every documented and generated command work as written, with no ``-i`` to edit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import click

from abeja_cli.errors import InputError

__all__ = [
    "DEFAULT_IMAGE",
    "DOTENV",
    "IMAGE_VARIABLE",
    "default_image",
    "dotenv_image",
    "image_origin",
]

DEFAULT_IMAGE: Final = "python:3.11-slim"
IMAGE_VARIABLE: Final = "ABEJA_IMAGE"
#: The project's file of CLI settings, read for IMAGE_VARIABLE (the environment wins over it).
DOTENV: Final = ".env"


def dotenv_image(project: Path) -> str | None:
    """ABEJA_IMAGE of the project's .env, if it sets one."""
    dotenv = project / DOTENV
    if not dotenv.is_file():
        return None
    from dotenv import dotenv_values

    try:
        value = dotenv_values(dotenv, interpolate=False, encoding="utf-8").get(IMAGE_VARIABLE)
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {dotenv} (for {IMAGE_VARIABLE}): {exc}") from None
    return value.strip() if value and value.strip() else None


def default_image() -> str:
    """``-i``'s default (click's ``default``, used when neither the flag nor the variable is
    set): ``.env``'s ABEJA_IMAGE in the current folder, else :data:`DEFAULT_IMAGE`."""
    return dotenv_image(Path.cwd()) or DEFAULT_IMAGE


def image_origin(source: click.core.ParameterSource | None, project: Path) -> str:
    """The variable that chose the image, as messages name it; "" for -i and the default."""
    if source is click.core.ParameterSource.ENVIRONMENT:
        return IMAGE_VARIABLE
    if source is click.core.ParameterSource.DEFAULT and dotenv_image(project) is not None:
        return f"{IMAGE_VARIABLE} in {project / DOTENV}"
    return ""
