"""``abeja model init``: every template makes a project that passes ``abeja model run-local`` as
generated, with the command its own README gives; nothing is ever overwritten."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import Result, readme_run_local

from abeja_cli.init import TEMPLATES
from abeja_runtime.launch import free_port

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
    "chat": lambda out: (
        json.loads(out)["object"] == "chat.completion"
        and json.loads(out)["choices"][0]["message"]["content"].endswith(". ")
    ),
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
    handler = TEMPLATES[template].handler
    assert f"abeja model run-local-server -h {handler}" in readme and "curl -s " in readme
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


def test_the_chat_template_serves_openai_clients_as_its_readme_says(
    abeja: Abeja, start_abeja: Callable[..., Any], tmp_path: Path
) -> None:
    """The README's run-local-server line, then its curl line and its Python example, as
    written (only the port is this test's own)."""
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed (apt-get install curl): the README's line needs it")
    assert abeja("model", "init", "chat", "--template", "chat", cwd=tmp_path).returncode == 0
    project = tmp_path / "chat"
    readme = (project / "README.md").read_text()
    port = str(free_port())
    serve = readme_line(readme, "abeja model run-local-server ").replace("8080", port)
    cli = start_abeja(*shlex.split(serve)[1:], "--engine", "local", cwd=project)
    endpoint = cli.endpoint()
    assert endpoint == f"http://127.0.0.1:{port}", cli.output()

    curl = readme_line(readme, "curl -s localhost:8080").replace("8080", port)
    sent = subprocess.run(shlex.split(curl), cwd=project, capture_output=True, timeout=60)
    answer = json.loads(sent.stdout)
    assert answer["object"] == "chat.completion", sent
    assert answer["choices"][0]["message"]["role"] == "assistant"

    example = readme.split("```python\n", 1)[1].split("```", 1)[0].replace("8080", port)
    shown = subprocess.run(
        [sys.executable, "-c", example], capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0, shown.stderr
    streamed = shown.stdout.split()  # the toy's words, unseeded: each run its own
    assert streamed and set(streamed) <= set(chat_words(project)), shown.stdout


def chat_words(project: Path) -> list[str]:
    """The words the chat template's toy model knows."""
    source = (project / "main.py").read_text()
    return source.split('CORPUS = """', 1)[1].split('"""', 1)[0].split()


def readme_line(readme: str, start: str) -> str:
    return next(line for line in readme.splitlines() if line.startswith(start))


def test_the_readme_shows_the_chat_example_that_is_tested(tmp_path: Path) -> None:
    """The repository README's chat example is the template's, which the test above runs."""
    generated = TEMPLATES["chat"].readme("chat")
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    python = generated.split("```python\n", 1)[1].split("```", 1)[0]
    assert f"```python\n{python}```" in readme
    assert readme_line(generated, "curl -s localhost:8080") in readme.splitlines()
    assert readme_line(generated, "abeja model run-local-server ") in readme.splitlines()
