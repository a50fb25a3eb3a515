"""``abeja model build``: a production image that runs with plain ``docker run``.

Bad input is refused before Docker is even asked; the image built from the ``replica`` test
project is run read-only, as a non-root user, without the CLI, and stopped with SIGTERM.
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from docker.errors import NotFound
from helpers.cli import REPO, Result, http_request, run_abeja
from helpers.waiting import wait_until

from abeja_runtime.launch import free_ports

TIMEOUT = 60.0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-t", "My Model:1"], "-t 'My Model:1' is not an image name Docker accepts"),
        (["-t", "mymodel:1:2"], "is not an image name Docker accepts"),
        (["-t", "ok:1", "-e", "NOVALUE"], "-e 'NOVALUE' has no value"),
        (["-t", "ok:1", "-h", "missing:handler"], "there is no missing.py in "),
        (["-t", "ok:1", "-e", "API_TOKEN:abc"], "API_TOKEN would be baked into the image"),
        (["-t", "ok:1", "-e", "db_password=x"], "db_password would be baked into the image"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_before_anything_is_built(
    project: Callable[[str], Path], args: list[str], message: str
) -> None:
    cwd = project("tax")
    argv = ["model", "build", "-h", "main:handler", *args]
    if "-h" in args:
        argv = ["model", "build", *args]
    result = run_abeja(*argv, cwd=cwd)
    assert result.returncode == 2, str(result)
    assert len(result.error_lines()) == 1, str(result)
    assert message in result.error_lines()[0]
    assert "building" not in result.stderr


def test_a_missing_tag_is_a_usage_error(project: Callable[[str], Path]) -> None:
    result = run_abeja("model", "build", "-h", "main:handler", cwd=project("tax"))
    assert result.returncode == 2
    assert "Missing option '-t' / '--tag'" in result.stderr


@pytest.fixture
def run_container(docker_client: Any) -> Iterator[Callable[..., Any]]:
    """``run_container(image, **options)``: a detached container, removed after the test."""
    started: list[Any] = []

    def run(image: str, **options: Any) -> Any:
        container = docker_client.containers.run(image, detach=True, **options)
        started.append(container)
        return container

    yield run
    for container in started:
        container.remove(force=True)


def published(container: Any, port: int) -> str:
    container.reload()
    binding = container.attrs["NetworkSettings"]["Ports"][f"{port}/tcp"][0]
    return f"http://127.0.0.1:{binding['HostPort']}"


def wait_healthy(container: Any) -> str:
    """The health URL once it answers 200 (bounded); fails with the container's log."""
    health = published(container, 5001)

    def ready() -> bool:
        try:
            return http_request(f"{health}/health_check", timeout=2)[0] == 200
        except OSError:
            return False

    try:
        wait_until(ready, TIMEOUT, "the container to be ready")
    except AssertionError:
        raise AssertionError(container.logs().decode("utf-8", "replace")[-3000:]) from None
    return health


@pytest.mark.docker
def test_read_only_without_a_writable_tmp_says_which_mount_is_needed(
    production_image: tuple[str, Path], docker_client: Any
) -> None:
    tag, _project = production_image
    container = docker_client.containers.run(tag, read_only=True, detach=True)
    try:
        code = container.wait(timeout=60)["StatusCode"]
        logs = container.logs().decode()
    finally:
        container.remove(force=True)
    assert code == 1, logs
    assert "no writable temporary directory" in logs and "--tmpfs /tmp" in logs, logs
    assert "Traceback" not in logs, logs


@pytest.mark.docker
def test_the_image_runs_read_only_as_non_root_with_plain_docker_run(
    production_image: tuple[str, Path], docker_client: Any, run_container: Callable[..., Any]
) -> None:
    tag, _project = production_image
    image = docker_client.images.get(tag)
    config = image.attrs["Config"]
    assert config["User"] == "10001:10001"
    assert set(config["ExposedPorts"]) == {"5000/tcp", "5001/tcp"}
    assert config["Healthcheck"]["Test"] == ["CMD", "python", "-m", "abeja_runtime.probe"]
    assert "HANDLER=main:handler" in config["Env"]
    assert "BAKED=yes" in config["Env"]  # -e at build time
    assert image.labels["org.abeja-runtime.project"] == "replica"  # not the builder's path

    container = run_container(
        tag,
        read_only=True,
        tmpfs={"/tmp": ""},
        ports={"5000/tcp": ("127.0.0.1", None), "5001/tcp": ("127.0.0.1", None)},
        environment={"ABEJA_RUNTIME_WORKERS": "2"},  # a runtime option as a variable
    )
    health = wait_healthy(container)
    status, body = http_request(published(container, 5000) + "/?ms=1", b'{"x": 1}')
    assert status == 200, body
    assert json.loads(body)["echo"] == {"x": 1}

    assert container.exec_run("id -u").output.strip() == b"10001"
    pid1 = container.exec_run("cat /proc/1/cmdline").output.split(b"\0")
    assert pid1[1].endswith(b"abeja-runtime"), pid1
    logs = container.logs().decode()
    assert logs.count("is ready") == 2, logs
    metrics = http_request(f"{health}/metrics")[1].decode()
    assert 'abeja_runtime_requests_total{code="200"} 1.0' in metrics

    container.stop(timeout=20)  # SIGTERM: drain and exit 0
    container.reload()
    assert container.attrs["State"]["ExitCode"] == 0
    assert "shutting down gracefully" in container.logs().decode()


@pytest.mark.docker
def test_the_image_reports_healthy_to_docker(
    production_image: tuple[str, Path], run_container: Callable[..., Any]
) -> None:
    tag, _project = production_image
    container = run_container(
        tag,
        read_only=True,
        tmpfs={"/tmp": ""},
        healthcheck={
            "test": ["CMD", "python", "-m", "abeja_runtime.probe"],
            "interval": 500_000_000,
        },
    )

    def health_status() -> str | None:
        container.reload()
        status = container.attrs["State"].get("Health", {}).get("Status")
        return status if status in ("healthy", "unhealthy") else None

    assert wait_until(health_status, TIMEOUT, "Docker's health status") == "healthy"


def test_build_help_names_the_run_command(project: Callable[[str], Path]) -> None:
    result: Result = run_abeja("model", "build", "--help", cwd=project("tax"))
    assert result.returncode == 0
    assert "docker run --read-only --tmpfs /tmp" in result.text


def documented_step_6() -> list[list[str]]:
    """The commands of docs/first-model.md's step 6, in order, as argv."""
    text = (REPO / "docs" / "first-model.md").read_text("utf-8")
    step = text[text.index("## 6. ") :]
    commands = []
    for block in re.findall(r"^```sh\n(.*?)^```$", step, re.DOTALL | re.MULTILINE):
        commands += [shlex.split(line) for line in block.splitlines() if line.strip()]
    return commands


@pytest.mark.docker
def test_first_model_step_6_waits_for_the_container_as_written(
    production_image: tuple[str, Path], docker_client: Any, tmp_path: Path
) -> None:
    """The document's `docker run`, then at once its curl commands: they wait for the model to
    be ready (no request lands in the second the container takes to start). Run with this
    test's image and free host ports instead of the document's."""
    tag, _project = production_image
    commands = documented_step_6()
    (run,) = [argv for argv in commands if argv[:2] == ["docker", "run"]]
    curls = [argv for argv in commands if argv[0] == "curl"]
    assert curls, "step 6 gives no command that waits for the container and sends a request"
    documented_image = run[-1]
    ports = dict(zip(("5000", "5001"), map(str, free_ports(2)), strict=True))

    def here(word: str) -> str:
        if word == documented_image:
            return tag
        for port, free in ports.items():
            word = word.replace(f"{port}:{port}", f"{free}:{port}")
            word = word.replace(f"localhost:{port}", f"localhost:{free}")
        return word

    cidfile, log = tmp_path / "container.id", tmp_path / "docker-run.log"
    with log.open("wb") as output:
        server = subprocess.Popen(
            ["docker", "run", "--cidfile", str(cidfile), *map(here, run[2:])],
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        (tmp_path / "request.json").write_text('{"x": 1}')
        answers = []
        for curl in curls:
            done = subprocess.run(
                [*map(here, curl)], cwd=tmp_path, capture_output=True, timeout=TIMEOUT
            )
            assert done.returncode == 0, (curl, done, log.read_text())
            answers.append(done.stdout)
        assert json.loads(answers[-1])["echo"] == {"x": 1}, answers
    finally:
        server.terminate()  # the docker CLI passes it on: the model stops gracefully
        try:
            server.wait(TIMEOUT)
        finally:
            if cidfile.exists():
                with contextlib.suppress(NotFound):
                    docker_client.containers.get(cidfile.read_text().strip()).remove(force=True)
