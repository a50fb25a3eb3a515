"""``abeja model init``: every template makes a project that passes ``abeja model run-local`` as
generated, with the command its own README gives; nothing is ever overwritten."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.cli import Result, readme_run_local

from abeja_cli.init import TEMPLATES

Abeja = Callable[..., Result]

CHECKS: dict[str, Callable[[bytes], bool]] = {
    "json": lambda out: json.loads(out) == {"words": 5, "longest": "answering"},
    "image": lambda out: out == b"",  # the image went to --output
    "multipart": lambda out: (
        json.loads(out)
        == {
            "fields": {"title": "notes"},
            "files": [{"name": "document", "file_name": "request.txt", "size": 32}],
        }
    ),
    "csv": lambda out: json.loads(out) == {"rows": 2, "sums": {"price": 3.5, "quantity": 7.0}},
    "numpy": lambda out: len(json.loads(out)["outputs"]) == 2,
    "cortex": lambda out: json.loads(out) == "iris-setosa",
}


@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_each_template_runs_as_generated(abeja: Abeja, tmp_path: Path, template: str) -> None:
    assert set(CHECKS) == set(TEMPLATES)
    made = abeja("model", "init", "my-model", "--template", template, cwd=tmp_path)
    assert made.returncode == 0, str(made)
    project = tmp_path / "my-model"
    files = sorted(p.name for p in project.iterdir())
    assert {"main.py", "requirements.txt", "README.md", ".dockerignore"} <= set(files)
    readme = (project / "README.md").read_text()
    assert "abeja model run-local-server -h main:handler" in readme and "curl -s " in readme
    assert f"[info] created a project from the {template} template in " in made.stderr
    # The local engine installs requirements.txt itself: the README does not ask the user to.
    assert "installed in an\nenvironment of its own" in readme, readme

    result = abeja(*readme_run_local(project), "--engine", "local", "-q", cwd=project)
    assert result.returncode == 0, str(result)
    assert CHECKS[template](result.stdout), result.stdout[:300]
    if template == "image":
        assert (project / "answer.jpg").read_bytes()[:3] == b"\xff\xd8\xff"  # a JPEG


def test_init_never_overwrites(abeja: Abeja, tmp_path: Path) -> None:
    (tmp_path / "main.py").write_text("# mine\n")
    result = abeja("model", "init", cwd=tmp_path)
    assert result.returncode == 2
    assert result.error_lines() == [
        "[error] . already has main.py; choose an empty folder (abeja model init NEW_FOLDER) "
        "or move them away"
    ]
    assert (tmp_path / "main.py").read_text() == "# mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["main.py"]
