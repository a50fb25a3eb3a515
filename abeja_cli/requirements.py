"""A project's requirements, from ``requirements.txt`` or else a ``Pipfile``.

The handler guide of ABEJA Platform allows either file. Both engines take the same lines from
here: the local engine installs them into the project's venv, the Docker engine into the
project image (as the ``requirements.txt`` of its build context).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from abeja_cli.errors import InputError

__all__ = ["requirements_of", "requirements_text"]


def requirements_of(project: Path) -> list[str] | None:
    """The project's requirement lines, from requirements.txt or else a Pipfile; None if none."""
    requirements = project / "requirements.txt"
    if requirements.is_file():
        lines = requirements.read_text("utf-8").splitlines()
        wanted = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
        return wanted or None
    pipfile = project / "Pipfile"
    if pipfile.is_file():
        return _pipfile_packages(pipfile) or None
    return None


def _pipfile_packages(pipfile: Path) -> list[str]:
    """``[packages]`` of a Pipfile as requirement strings (``name``, ``name==1.2``, extras)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        raise InputError(
            f"{pipfile}: reading a Pipfile needs Python 3.11 or later; write the packages in "
            "requirements.txt instead"
        ) from None
    try:
        packages: dict[str, Any] = tomllib.loads(pipfile.read_text("utf-8")).get("packages", {})
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{pipfile} is not valid TOML ({exc}); fix it") from None
    result = []
    for name, spec in packages.items():
        version, extras = (
            (spec, [])
            if isinstance(spec, str)
            else (spec.get("version", "*"), spec.get("extras", []))
        )
        extra = f"[{','.join(extras)}]" if extras else ""
        result.append(f"{name}{extra}{'' if version in ('*', '') else version}")
    return result


def requirements_text(project: Path) -> bytes:
    """What a ``requirements.txt`` of the project says: the file itself when there is one
    (options and comments kept for pip), the Pipfile's packages otherwise, or nothing."""
    requirements = project / "requirements.txt"
    if requirements.is_file():
        return requirements.read_bytes()
    lines = requirements_of(project)
    return "".join(f"{line}\n" for line in lines).encode() if lines else b""
