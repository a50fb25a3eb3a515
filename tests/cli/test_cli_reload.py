"""``run-local-server --reload`` while the handler cannot be loaded: the model's port answers
``503`` with the error, instead of refusing connections, until an edit brings the model back;
with either engine (a container that exited gives its port back, the stand-in gives it back to
the restarted container)."""

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

#: A broken edit, and what the 503 names: the error the runtime logged when it gave up.
IMPORT = (
    "import not_installed_anywhere\n" + VERSIONED.format(version=2),
    "failed to setup model: Importing the module [main] specified in HANDLER[main:handler] "
    "failed: No module named 'not_installed_anywhere'. Add the missing package to "
    "requirements.txt.",
    "ModuleNotFoundError: No module named 'not_installed_anywhere'",
)
SYNTAX = (
    "def handler(request, context)\n    return {}\n",
    "failed to setup model: Importing the module [main] specified in HANDLER[main:handler] "
    "raised SyntaxError: expected ':' (main.py, line 1)",
    "SyntaxError: expected ':'",
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
def test_a_broken_main_py_is_answered_503_until_fixed(
    start_abeja: Start,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    engine: str,
    broken: tuple[str, str, str],
) -> None:
    source, error, traceback_end = broken
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
    cli.wait_for(r"\[error\] the model server stopped before it was ready .*waiting", since=mark)
    line = cli.wait_for(r"answers 503", since=mark)
    assert line == (
        f"[info] until then {endpoint} answers 503 with this error (a fix of main.py "
        "restarts the model server)"
    )
    expected = {
        "status": (
            f"the model server is not running: {error.rstrip('.')}. Fix main.py and save it: "
            "run-local-server restarts the model server when a .py file of the project changes."
        ),
        "error": error,
    }
    for method, path, body in (("POST", "/", b"{}"), ("GET", "/any/path?x=1", None)):
        status, answer = http_request(endpoint + path, body, method=method)
        assert status == 503, answer
        got = json.loads(answer)
        assert got.pop("traceback").endswith(traceback_end), got
        assert got == expected

    mark = cli.mark()
    (tmp_path / "main.py").write_text(VERSIONED.format(version=3))
    cli.wait_for(r"the model server is ready again at " + endpoint, since=mark)
    assert json.loads(http_request(endpoint, b"{}")[1]) == {"version": 3}
    cli.send(signal.SIGINT)
    assert cli.wait(60) == 0
    if engine == "docker":
        client: Any = request.getfixturevalue("docker_client")
        assert ours(client, tmp_path.resolve()) == []
