"""The local engine's virtual environments: a project's requirements, installed once.

A project with a ``requirements.txt`` (or a ``Pipfile``) runs in a virtual environment made for
it, cached per project folder, requirements and Python, so the first run installs them and the
next runs start at once. The environment sees this Python's packages, so that abeja-runtime
itself, and what is already installed, need no second install; the requirements are installed on
top and win. ``--system-site-packages`` alone is not enough: made from a virtual environment's
Python (the usual way to install a CLI), a venv sees the *base* interpreter's packages, not those
of the CLI's venv, so a ``.pth`` file adds this Python's own site directories after the venv's.
``uv`` is used when it is installed (the ``uv`` package next to the CLI,
``pip install 'abeja-runtime[local]'``, or on PATH): measured on the
2-core development machine, Pillow and numpy into an empty environment without caches took
pip 4.5-5.2 s and uv 0.6-0.9 s (3 runs each). pip otherwise.
"""

from __future__ import annotations

import hashlib
import shutil
import site
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Final

from abeja_cli.console import Console
from abeja_cli.errors import BuildError
from abeja_cli.images import cache_dir
from abeja_cli.requirements import requirements_of

__all__ = ["project_python"]

_READY: Final = ".abeja-ready"
#: In the venv's site-packages: puts this Python's site directories after the venv's own.
_INHERIT_PTH: Final = "_abeja_cli_site.pth"
#: Environments kept: one per project and requirements, the newest few.
_KEEP: Final = 16


def project_python(project: Path, console: Console) -> str:
    """The Python interpreter that runs the project's model (a cached venv when it needs one)."""
    requirements = requirements_of(project)
    if requirements is None:
        return sys.executable
    key = hashlib.sha256(
        "\n".join([str(project), sys.executable, sys.version, *requirements]).encode()
    ).hexdigest()[:16]
    root = cache_dir() / "venvs"
    venv = root / key
    python = venv / "bin" / "python"
    if (venv / _READY).is_file():
        console.info(f"using the environment with the project's requirements: {venv}")
        return str(python)
    root.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    console.info(f"installing the project's requirements into {venv} (once per change)")
    with tempfile.TemporaryDirectory(dir=root, prefix=".new-") as tmp:
        staging = Path(tmp) / "venv"
        # No pip of its own (ensurepip takes seconds): this Python's pip installs into it.
        _run(
            [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(staging)],
            console,
        )
        _inherit_site_packages(staging)
        _install(staging / "bin" / "python", requirements, console)
        (staging / _READY).write_text("\n".join(requirements) + "\n")
        try:
            staging.rename(venv)
        except OSError:  # another run finished first: use its environment
            if not (venv / _READY).is_file():
                raise
    console.info(f"installed the project's requirements ({time.monotonic() - started:.1f} s)")
    _prune(root, keep=venv)
    return str(python)


def _inherit_site_packages(venv: Path) -> None:
    """Let the venv import what this Python imports (abeja-runtime first of all).

    ``site.addsitedir`` rather than plain paths: it also runs the ``.pth`` files there, which is
    how editable installs (``pip install -e .``) put their source folder on the path.
    """
    (own,) = venv.glob("lib/python*/site-packages")
    paths = site.getsitepackages()
    if site.ENABLE_USER_SITE:  # pip install --user; a venv turns the user's site off
        paths.append(site.getusersitepackages())
    lines = [f"import site; site.addsitedir({path!r})" for path in paths]
    (own / _INHERIT_PTH).write_text("\n".join(lines) + "\n")


def _uv() -> str | None:
    try:
        from uv import find_uv_bin

        return str(find_uv_bin())
    except (ImportError, FileNotFoundError):
        return shutil.which("uv")


def _install(python: Path, requirements: list[str], console: Console) -> None:
    uv = _uv()
    if uv is not None:
        command = [uv, "pip", "install", "--python", str(python), *requirements]
    else:
        command = [sys.executable, "-m", "pip", "--python", str(python), "install",
                   "--disable-pip-version-check", *requirements]  # fmt: skip
    _run(command, console)


def _run(command: list[str], console: Console) -> None:
    """Run an install step; its output is shown with -v, and after the error if it fails."""
    proc = subprocess.run(
        command, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False
    )
    output = proc.stdout + proc.stderr
    for line in output.splitlines():
        console.detail(line)
    if proc.returncode != 0:
        raise BuildError(
            "installing the project's requirements failed (see the log below); fix "
            "requirements.txt (or the Pipfile) and run again",
            log=output,
        )


def _prune(root: Path, keep: Path) -> None:
    """Keep the newest environments: each change of requirements makes a new one."""
    ready = sorted(
        (p for p in root.iterdir() if (p / _READY).is_file()),
        key=lambda p: (p / _READY).stat().st_mtime,
        reverse=True,
    )
    for old in ready[_KEEP:]:
        if old != keep:
            shutil.rmtree(old, ignore_errors=True)
