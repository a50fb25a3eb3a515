"""The CLI installed the way most users install a Python tool: into a virtual environment.

The rest of the suite runs the CLI from the Python that runs pytest (CI's system Python), which
hid a venv-only bug: the local engine's per-project environment saw the base interpreter's
packages, not the CLI venv's, and could not import abeja_runtime (or, where the base interpreter
has a copy, as here, imported that one instead of the CLI's).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers.cli import CLI_TIMEOUT, REPO, cli_env, readme_run_local

#: Creating the venv and installing the checkout (and its dependencies) into it.
_INSTALL_TIMEOUT = 300.0


@pytest.fixture(scope="module")
def venv_abeja(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``abeja`` from a fresh venv (no system site packages) with this checkout installed.

    Not editable: the runtime's files are then in the venv, where the model must find them.
    """
    venv = tmp_path_factory.mktemp("cli-venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=60)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    subprocess.run(
        [*pip, "install", "-q", str(REPO)],
        check=True,
        stdin=subprocess.DEVNULL,
        timeout=_INSTALL_TIMEOUT,
    )
    return venv / "bin" / "abeja"


def test_a_template_with_requirements_runs_on_the_local_engine(
    venv_abeja: Path, tmp_path: Path
) -> None:
    env = cli_env(ABEJA_RUNTIME_CACHE=str(tmp_path / "cache"))
    run = {"env": env, "capture_output": True, "text": True, "timeout": CLI_TIMEOUT}
    made = subprocess.run(
        [str(venv_abeja), "model", "init", "my-model", "--template", "image"], cwd=tmp_path, **run
    )
    assert made.returncode == 0, made.stderr
    project = tmp_path / "my-model"
    assert (project / "requirements.txt").read_text().strip()  # the case that failed

    command = [str(venv_abeja), *readme_run_local(project), "--engine", "local"]
    result = subprocess.run(command, cwd=project, **run)
    assert result.returncode == 0, result.stderr
    assert (project / "answer.jpg").read_bytes()[:3] == b"\xff\xd8\xff"  # a JPEG

    # The model runs with the CLI's own copy of the runtime, not another one on the machine.
    (project / "where.py").write_text(
        "import abeja_runtime\n\n\ndef handler(request, context):\n"
        "    return {'content_type': 'text/plain', 'content': abeja_runtime.__file__}\n"
    )
    ask = ["-h", "where:handler", "-q", "--input", "request.jpg"]
    where = subprocess.run(
        [str(venv_abeja), "model", "run-local", "--engine", "local", *ask], cwd=project, **run
    )
    assert where.returncode == 0, where.stderr
    assert where.stdout.startswith(str(venv_abeja.parent.parent)), where.stdout
