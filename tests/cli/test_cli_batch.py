"""``abeja model run-batch`` with the local engine: the real CLI runs ``abeja-runtime batch``.

The Docker engine's run is in ``test_cli_docker.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from helpers.cli import Result

LOCAL = ("--engine", "local")

Abeja = Callable[..., Result]
Project = Callable[[str], Path]


def test_a_folder_of_inputs_is_answered_file_by_file(abeja: Abeja, project: Project) -> None:
    cwd = project("tax")
    inputs = cwd / "inputs"
    inputs.mkdir()
    (inputs / "one.json").write_text('{"total_without_tax": 100}')
    (inputs / "two.json").write_text('{"nothing": 0}')

    result = abeja("model", "run-batch", *LOCAL, "-h", "main:handler", "inputs", cwd=cwd)

    assert result.returncode == 1, str(result)  # two.json was answered 400
    assert json.loads((cwd / "batch-output" / "one.json.json").read_text()) == {"total": 108.0}
    assert json.loads((cwd / "batch-output" / "two.json.json").read_text()) == {
        "message": "total_without_tax is need"
    }
    assert "[info] running the batch over 1 input path(s)" in result.stderr
    assert "2 input(s): 1 answered 2xx, 1 failed (400: 1): two.json" in result.stderr
    assert result.stdout == b""


def test_input_from_the_environment_is_answered_on_stdout(abeja: Abeja, project: Project) -> None:
    cwd = project("tax")
    result = abeja(
        "model", "run-batch", *LOCAL, "-h", "main:handler", "-q",
        "-e", 'INPUT={"total_without_tax": 50}',
        cwd=cwd,
    )  # fmt: skip
    assert result.returncode == 0, str(result)
    assert json.loads(result.stdout) == {"total": 54.0}
    assert result.stderr == ""


def test_bad_arguments_stop_before_anything_runs(abeja: Abeja, project: Project) -> None:
    cwd = project("tax")
    missing = abeja("model", "run-batch", *LOCAL, "-h", "main:handler", "nope", cwd=cwd)
    assert missing.returncode == 2
    assert "Path 'nope' does not exist" in missing.stderr

    (cwd / "taken").write_text("a file")
    clash = abeja(
        "model", "run-batch", *LOCAL, "-h", "main:handler", "request.json", "--output", "taken",
        cwd=cwd,
    )  # fmt: skip
    assert clash.returncode != 0
    assert "taken" in clash.stderr
