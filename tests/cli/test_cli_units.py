"""Pure logic of the CLI, in-process: output rendering, log formatting, image keys and
build contexts, file watching."""

from __future__ import annotations

import io
import re
import socket
import tarfile
import threading
from pathlib import Path

import pytest

from abeja_cli import client, images, progress
from abeja_cli.client import ModelResponse
from abeja_cli.console import Console
from abeja_cli.errors import ServerError
from abeja_cli.inputs import ModelRequest
from abeja_cli.output import render_body, write_response
from abeja_cli.reload import ChangeWatcher
from abeja_cli.server_log import format_log_line


def response(body: bytes, content_type: str = "", status: int = 200) -> ModelResponse:
    headers = [("Content-Type", content_type)] if content_type else []
    return ModelResponse(status, "OK" if status == 200 else "Teapot", headers, body)


@pytest.mark.parametrize(
    ("body", "content_type", "shown"),
    [
        (b'{"a":1,"b":"\\u65e5"}', "application/json", '{\n    "a": 1,\n    "b": "日"\n}\n'),
        (b'{"a": 1}', "application/json; charset=utf8", '{\n    "a": 1\n}\n'),
        (b'{"a": 1}', "application/problem+json", '{\n    "a": 1\n}\n'),
        (b'{"a": 1}\n{"b": 2}', "application/json", '{"a": 1}\n{"b": 2}'),  # JSON Lines
        (b'{"a": 1}', "text/plain", '{"a": 1}'),  # not JSON by type: as it came
        (b"hello", "text/plain", "hello"),  # no newline added
        (b"", "application/json", ""),
    ],
)
def test_render_body(body: bytes, content_type: str, shown: str) -> None:
    assert render_body(response(body, content_type)) == shown.encode("utf-8")


def test_binary_body_is_byte_exact() -> None:
    body = bytes(range(256)) * 4
    assert render_body(response(body, "image/jpeg")) == body


def test_error_status_prints_body_and_status(capsys: pytest.CaptureFixture[str]) -> None:
    out = io.BytesIO()
    code = write_response(
        response(b'{"m": 1}', "application/json", 418), console=Console(), stdout=out
    )
    assert code == 1
    assert out.getvalue() == b'{\n    "m": 1\n}\n'
    assert capsys.readouterr().err == ("[error] the model answered 418 Teapot (application/json)\n")


def test_output_file_gets_the_raw_body(tmp_path: Path) -> None:
    out = io.BytesIO()
    target = tmp_path / "answer.json"
    code = write_response(
        response(b'{"a":1}', "application/json"),
        console=Console(quiet=True),
        stdout=out,
        output=target,
    )
    assert (code, out.getvalue(), target.read_bytes()) == (0, b"", b'{"a":1}')


@pytest.mark.parametrize(
    ("line", "shown"),
    [
        ('{"log_level": "info", "message": "worker 7 is ready"}', "worker 7 is ready"),
        ('{"log_level": "error", "message": "boom"}', "ERROR: boom"),
        (
            '{"log_type": "access_log", "http_method": "POST", "http_path": "/predict", '
            '"http_status": 200, "elapsed_microsecs": 1500}',
            "access: POST /predict 200 (1.5 ms)",
        ),
        (  # a runtime older than the path field
            '{"log_type": "access_log", "http_method": "POST", "http_status": 200}',
            "access: POST 200",
        ),
        ("plain print output", "plain print output"),
        ('{"no_message": 1}', '{"no_message": 1}'),
        ("[1, 2]", "[1, 2]"),
    ],
)
def test_log_lines_are_shortened(line: str, shown: str) -> None:
    assert format_log_line(line) == shown


def test_runtime_source_is_this_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ABEJA_RUNTIME_SOURCE", raising=False)
    source = images.find_runtime_source()
    assert source.root == Path(__file__).resolve().parents[2]
    assert source.runtime_dockerfile.is_file() and source.project_dockerfile.is_file()
    version, _, digest = source.version.partition("+")
    assert version and len(digest) == 12


def test_runtime_source_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from abeja_cli.errors import EngineUnavailable

    monkeypatch.setenv("ABEJA_RUNTIME_SOURCE", str(tmp_path))
    with pytest.raises(EngineUnavailable, match="set ABEJA_RUNTIME_SOURCE to a checkout"):
        images.find_runtime_source()


def _key(project: Path, requirements: str = "none", base_id: str = "sha256:1") -> images.ProjectKey:
    runtime = images.RuntimeKey("python:3.11-slim", base_id, "0.1.0+abc", "r1")
    return images.ProjectKey(runtime, project, requirements, "p1")


def test_project_key_changes_with_each_input(tmp_path: Path) -> None:
    key = _key(tmp_path / "a")
    assert key.digest == _key(tmp_path / "a").digest
    others = [
        _key(tmp_path / "b"),
        _key(tmp_path / "a", requirements="abc"),
        _key(tmp_path / "a", base_id="sha256:2"),
    ]
    assert len({key.digest, *(k.digest for k in others)}) == 4
    labels = key.labels()
    assert labels["org.abeja-runtime.project"] == str(tmp_path / "a")
    assert labels["org.abeja-runtime.base-image"] == "python:3.11-slim"
    assert labels["org.abeja-runtime.requirements-sha256"] == "none"
    assert labels["org.abeja-runtime.runtime-version"] == "0.1.0+abc"
    assert key.tag.startswith("abeja-local/a-") and key.tag.endswith(":" + key.digest[:12])


def test_requirements_digest(tmp_path: Path) -> None:
    assert images.requirements_digest(tmp_path) == "none"
    (tmp_path / "requirements.txt").write_text("numpy\n")
    first = images.requirements_digest(tmp_path)
    (tmp_path / "requirements.txt").write_text("numpy>=2\n")
    assert first != images.requirements_digest(tmp_path) != "none"


def test_project_context_leaves_out_caches(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    for name in ("main.py", "sub/model.bin", ".git/HEAD", "__pycache__/main.pyc", "x.pyc"):
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(name)
    with (
        images.project_context(images.find_runtime_source(), project) as context,
        tarfile.open(fileobj=context) as tar,
    ):
        names = tar.getnames()
    assert sorted(names) == [
        "Dockerfile",
        "abeja-build/requirements.txt",
        "project",
        "project/main.py",
        "project/sub/model.bin",
    ]


def test_project_context_honours_dockerignore(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    for name in ("main.py", "data/big.bin", "run.log", "keep/a.txt"):
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(name)
    (project / ".dockerignore").write_text("# large files\ndata\n*.log\n")
    with (
        images.project_context(images.find_runtime_source(), project) as context,
        tarfile.open(fileobj=context) as tar,
    ):
        names = {n for n in tar.getnames() if n.startswith("project/")}
    assert names == {"project/main.py", "project/keep/a.txt", "project/.dockerignore"}


def test_change_watcher(tmp_path: Path) -> None:
    (tmp_path / "main.py").write_text("a = 1\n")
    (tmp_path / "data.txt").write_text("x")
    watcher = ChangeWatcher(tmp_path)
    assert watcher.changes() == []
    (tmp_path / "main.py").write_text("a = 22\n")
    (tmp_path / "data.txt").write_text("changed, but not .py")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "new.py").write_text("")
    assert watcher.changes() == [tmp_path / "main.py", tmp_path / "pkg" / "new.py"]
    (tmp_path / "pkg" / "new.py").unlink()
    assert watcher.changes() == [tmp_path / "pkg" / "new.py"]
    assert watcher.changes() == []


def test_label_instruction_quotes_values() -> None:
    line = images.label_instruction({"b.key": 'a "q" $HOME é', "a.key": "x"})
    assert line == '\nLABEL "a.key"="x" "b.key"="a \\"q\\" \\$HOME é"\n'.encode()


def test_runtime_wheel_has_every_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """Images install the runtime from the wheel the CLI builds from this checkout: a
    sub-package missing from pyproject's package list breaks every Docker run, so say so here
    plainly. (The wheels are cached per runtime version, so this is quick after the first.)"""
    import zipfile

    monkeypatch.delenv("ABEJA_RUNTIME_SOURCE", raising=False)
    source = images.find_runtime_source()
    wheels = images.runtime_wheels(source, lambda line: None)
    (wheel,) = wheels.glob("abeja_runtime-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    shipped = {Path(n).parent.as_posix() for n in names if n.endswith(".py")}
    packages = {
        p.parent.relative_to(source.root).as_posix()
        for p in (source.root / "abeja_runtime").rglob("__init__.py")
    }
    missing = sorted(packages - shipped)
    assert not missing, f"not in the wheel (add them to pyproject's packages): {missing}"
    # Files the runtime reads at run time (Seldon's compiled protocol) ship too.
    data = {
        p.relative_to(source.root).as_posix()
        for p in (source.root / "abeja_runtime").rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts
    }
    unshipped = sorted(data - names)
    assert not unshipped, f"not in the wheel (add them to pyproject's package-data): {unshipped}"


def test_a_server_that_never_answers_is_given_up_on_with_progress_lines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(client, "PROGRESS_EVERY", 0.2)
    lines: list[str] = []
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts (the kernel), never reads
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        request = ModelRequest("POST", "application/json", b"{}")
        with pytest.raises(ServerError) as error:
            client.send(url, request, timeout=1.0, progress=lines.append)
    assert f"the model server at {url} did not answer within 1 s" in str(error.value)
    assert "raise --timeout" in str(error.value)
    assert lines and lines[0].startswith("still waiting for the model's answer (")


@pytest.mark.parametrize(
    ("env", "wait"),
    [({}, 90.0), ({"ABEJA_RUNTIME_TIMEOUT": "5"}, 35.0), ({"ABEJA_RUNTIME_TIMEOUT": "0"}, None)],
)
def test_the_cli_waits_for_an_answer_as_long_as_the_runtime_may_take(
    env: dict[str, str], wait: float | None
) -> None:
    assert client.answer_timeout(env) == wait


def test_a_long_build_phase_says_that_it_goes_on() -> None:
    lines: list[str] = []
    said = threading.Event()

    def info(line: str) -> None:
        lines.append(line)
        said.set()

    phases = progress.Phases(info, every=0.05)
    phases.start("runtime wheels ready", "building the runtime's wheels")
    assert said.wait(10), "no progress line while the phase went on"
    phases.end()
    assert re.fullmatch(r"building the runtime's wheels\.\.\. \(\d+ s\)", lines[0]), lines
    assert re.fullmatch(r"runtime wheels ready \(\d+\.\d s\)", lines[-1]), lines
    assert phases._ticker is None  # the ticker stopped with the phase


@pytest.mark.parametrize(
    ("line", "step"),
    [
        ("Collecting numpy==2.1.0", "Collecting numpy==2.1.0"),
        (
            "  Downloading https://files.example.com/packages/ab/numpy-2.1.0-cp311.whl (16.3 MB)",
            "Downloading numpy-2.1.0-cp311.whl (16.3 MB)",
        ),
        ("Installing collected packages: numpy", "Installing collected packages: numpy"),
        ("Resolved 2 packages in 120ms", "Resolved 2 packages in 120ms"),  # uv
        ("Step 3/5 : RUN pip install", None),
        (" ---> Running in 1a2b3c", None),
        ("Collecting " + "x" * 200, "Collecting " + "x" * 106 + "..."),  # 120 characters
    ],
)
def test_pip_steps_are_recognised(line: str, step: str | None) -> None:
    assert progress.pip_step(line) == step
