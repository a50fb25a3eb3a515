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
import os
import shutil
import site
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Final

from abeja_cli.console import Console
from abeja_cli.errors import BuildError
from abeja_cli.images import cache_dir
from abeja_cli.progress import Phases
from abeja_cli.requirements import requirements_of

__all__ = ["environments", "project_python", "running_from", "size_of"]

_READY: Final = ".abeja-ready"
#: The project folder an environment was made for (``abeja model clean`` finds it by that).
_PROJECT: Final = ".abeja-project"
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
    console.info(f"installing the project's requirements into {venv} (once per change)")
    phases = Phases(console.info)
    phases.start("installed the project's requirements", "installing the project's requirements")
    try:
        with tempfile.TemporaryDirectory(dir=root, prefix=".new-") as tmp:
            staging = Path(tmp) / "venv"
            # No pip of its own (ensurepip takes seconds): this Python's pip installs into it.
            venv_command = [sys.executable, "-m", "venv", "--system-site-packages"]
            _run([*venv_command, "--without-pip", str(staging)], console, phases)
            _inherit_site_packages(staging)
            _install(staging / "bin" / "python", requirements, console, phases)
            (staging / _PROJECT).write_text(str(project))
            (staging / _READY).write_text("\n".join(requirements) + "\n")
            try:
                staging.rename(venv)
            except OSError:  # another run finished first: use its environment
                if not (venv / _READY).is_file():
                    raise
    except BaseException:
        phases.abandon()
        raise
    phases.end()
    _prune(root, keep=venv)
    return str(python)


def environments(project: Path | None) -> list[Path]:
    """The local engine's environments made for ``project``, or all of them (None)."""
    root = cache_dir() / "venvs"
    if not root.is_dir():
        return []
    found = []
    for venv in sorted(root.iterdir()):
        if venv.name.startswith(".") or not venv.is_dir():
            continue  # an install under way
        if project is not None:
            try:
                made_for = (venv / _PROJECT).read_text()
            except OSError:  # made before the marker existed: only --all takes it
                continue
            if made_for != str(project):
                continue
        found.append(venv)
    return found


def running_from(venv: Path) -> int | None:
    """The id of a process that runs this environment's Python (a model served from it right
    now), where the system says (Linux's /proc); None otherwise."""
    python = str(venv / "bin" / "python")
    proc = Path("/proc")
    if not proc.is_dir():
        return None
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv0 = (entry / "cmdline").read_bytes().split(b"\0", 1)[0]
        except OSError:  # ended meanwhile, or another user's
            continue
        if argv0 == python.encode():
            return int(entry.name)
    return None


def size_of(folder: Path) -> int:
    """The bytes of the files in ``folder`` (links not followed)."""
    total = 0
    for dirpath, _dirnames, filenames in os.walk(folder):
        for name in filenames:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    return total


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


def _install(python: Path, requirements: list[str], console: Console, phases: Phases) -> None:
    uv = _uv()
    if uv is not None:
        command = [uv, "pip", "install", "--python", str(python), *requirements]
    else:
        command = [sys.executable, "-m", "pip", "--python", str(python), "install",
                   "--disable-pip-version-check", *requirements]  # fmt: skip
    _run(command, console, phases)


def _run(command: list[str], console: Console, phases: Phases) -> None:
    """Run an install step, its output read as it comes: shown with -v, its install steps
    named in the progress lines, and all of it shown after the error if it fails."""
    # Unbuffered: pip writes through Python's stdout, which holds a pipe's lines until exit.
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        encoding="utf-8",
        errors="replace",
        env=env,
    )
    assert proc.stdout is not None
    lines = []
    try:
        with proc.stdout:
            for line in proc.stdout:
                lines.append(line)
                console.detail(line.rstrip("\n"))
                phases.output(line)
        code = proc.wait()
    finally:
        if proc.poll() is None:  # interrupted: the install does not go on without us
            proc.kill()
            proc.wait()
    if code != 0:
        raise BuildError(
            "installing the project's requirements failed (see the log below); fix "
            "requirements.txt (or the Pipfile) and run again",
            log="".join(lines),
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
