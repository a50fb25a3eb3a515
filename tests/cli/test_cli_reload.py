"""``run-local-server --reload`` with an edit that cannot be loaded: the runtime reloads (SIGHUP)
and keeps the version before serving, the console says why the new one failed, and the next
good edit is served; with either engine (in a container, the runtime is its first process)."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import CliProcess, http_request, ours

Start = Callable[..., CliProcess]

VERSIONED = """\
def handler(request, context):
    return {{"content_type": "application/json", "content": {{"version": {version}}}}}
"""

#: A broken edit, and what the console says of it: the error the runtime's reload failed with.
IMPORT = (
    "import not_installed_anywhere\n" + VERSIONED.format(version=2),
    "Importing the module [main] specified in HANDLER[main:handler] failed: No module named "
    "'not_installed_anywhere'. Add the missing package to requirements.txt.",
)
SYNTAX = (
    "def handler(request, context)\n    return {}\n",
    "Importing the module [main] specified in HANDLER[main:handler] raised SyntaxError: "
    "expected ':' (main.py, line 1)",
)


@pytest.mark.parametrize(
    ("engine", "broken"),
    [
        ("local", IMPORT),
        ("local", SYNTAX),
        pytest.param("docker", IMPORT, marks=pytest.mark.docker),
    ],
    ids=["local-import", "local-syntax", "docker-import"],
)
def test_a_broken_main_py_leaves_the_version_before_serving_until_fixed(
    start_abeja: Start,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    engine: str,
    broken: tuple[str, str],
) -> None:
    source, error = broken
    (tmp_path / "main.py").write_text(VERSIONED.format(version=1))
    engine_args = ["--engine", engine]
    if engine == "docker":
        request.getfixturevalue("docker_tmp_projects")  # removes the image after the test
        engine_args += ["-i", request.getfixturevalue("base_image")]
    cli = start_abeja(
        "model", "run-local-server", *engine_args, "-h", "main:handler", "--reload",
        cwd=tmp_path,
    )  # fmt: skip
    endpoint = cli.endpoint()
    assert json.loads(http_request(endpoint, b"{}")[1]) == {"version": 1}

    mark = cli.mark()
    (tmp_path / "main.py").write_text(source)
    line = cli.wait_for(r"\[error\] the reload failed", since=mark, timeout=60)
    assert line == (
        f"[error] the reload failed: the new version could not be loaded: {error.rstrip('.')}; "
        f"{endpoint} still answers with the version before; waiting for the next change"
    ), line
    for method, path, body in (("POST", "/", b"{}"), ("GET", "/any/path?x=1", None)):
        status, answer = http_request(endpoint + path, body, method=method)
        assert (status, json.loads(answer)) == (200, {"version": 1})

    mark = cli.mark()
    (tmp_path / "main.py").write_text(VERSIONED.format(version=3))
    cli.wait_for(r"the model server serves the new version at " + endpoint, since=mark, timeout=60)
    assert json.loads(http_request(endpoint, b"{}")[1]) == {"version": 3}
    cli.send(signal.SIGINT)
    assert cli.wait(60) == 0
    if engine == "docker":
        client: Any = request.getfixturevalue("docker_client")
        assert ours(client, tmp_path.resolve()) == []
