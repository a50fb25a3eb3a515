"""Fixtures for the CLI tests: run the real ``abeja`` command, on copies of the samples.

* ``abeja(*args, cwd=...)`` runs ``python -m abeja_cli`` (the console script's code) to the
  end; ``start_abeja(...)`` starts it in the background for run-local-server and signal tests.
  Every background CLI is stopped after its test.
* ``project(name)`` copies ``samples/<name>`` or ``tests/cli/projects/<name>`` to a fresh
  folder, so tests never write into the repository and each copy is its own project.
* Docker tests (``@pytest.mark.docker``) get a connected client; without an engine they are
  skipped, and with ``ABEJA_REQUIRE_DOCKER=1`` such a skip is turned into a failure. After each
  Docker test no container of ours may be left; project images made by the tests are removed at
  the end of the session (the runtime image stays: it is the CLI's cache).
"""

from __future__ import annotations

import secrets
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import (
    BASE_IMAGE,
    REQUIRE_DOCKER,
    CliProcess,
    HeldIndex,
    Result,
    cli_env,
    copy_project,
    remove_project_images,
    run_abeja,
)


@pytest.fixture
def abeja() -> Callable[..., Result]:
    return run_abeja


@pytest.fixture
def start_abeja() -> Iterator[Callable[..., CliProcess]]:
    started: list[CliProcess] = []

    def start(*args: str, cwd: Path, env: dict[str, str] | None = None) -> CliProcess:
        proc = subprocess.Popen(
            [sys.executable, "-m", "abeja_cli", *args],
            cwd=cwd,
            env=env or cli_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        cli = CliProcess(proc)
        for stream, lines in ((proc.stdout, cli.stdout), (proc.stderr, cli.stderr)):
            threading.Thread(target=cli._read, args=(stream, lines), daemon=True).start()
        started.append(cli)
        return cli

    yield start
    for cli in started:
        if cli.process.poll() is None:
            cli.process.send_signal(signal.SIGTERM)
            try:
                cli.process.wait(30)
            except subprocess.TimeoutExpired:
                cli.process.kill()
                cli.process.wait()


@pytest.fixture
def project(tmp_path: Path) -> Callable[[str], Path]:
    """``project("tax")``: a fresh copy of a sample (or of tests/cli/projects/<name>)."""
    return lambda name: copy_project(name, tmp_path)


@pytest.fixture
def held_index() -> Iterator[Callable[..., HeldIndex]]:
    """``held_index(bind)``: a package index whose download waits for ``release()``; closed
    (released first) after the test."""
    made: list[HeldIndex] = []

    def make(bind: str = "127.0.0.1") -> HeldIndex:
        made.append(HeldIndex(bind))
        return made[-1]

    yield make
    for index in made:
        index.close()


# -- Docker -------------------------------------------------------------------------------


def _unavailable(reason: str) -> None:
    if REQUIRE_DOCKER:
        pytest.fail(f"ABEJA_REQUIRE_DOCKER=1, but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def docker_client() -> Iterator[Any]:
    from abeja_cli.docker_engine import connect_docker
    from abeja_cli.errors import EngineUnavailable

    try:
        client = connect_docker(timeout=60)
    except EngineUnavailable as exc:
        _unavailable(exc.reason)
    yield client
    client.close()


@pytest.fixture(scope="session")
def base_image(docker_client: Any) -> str:
    from docker.errors import ImageNotFound

    try:
        docker_client.images.get(BASE_IMAGE)
    except ImageNotFound:
        _unavailable(
            f"the base image {BASE_IMAGE} is not present (images are never pulled by the "
            "tests); set BASE_IMAGE to a local Python 3.11+ image"
        )
    return BASE_IMAGE


@pytest.fixture(scope="session")
def docker_projects(
    tmp_path_factory: pytest.TempPathFactory, docker_client: Any
) -> Iterator[Callable[[str], Path]]:
    """Project copies shared by the Docker tests of a session, so each image is built once."""
    root = tmp_path_factory.mktemp("docker-projects")
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            made[name] = copy_project(name, root)
        return made[name]

    yield get
    remove_project_images(docker_client, root)


@pytest.fixture
def docker_tmp_projects(tmp_path: Path, docker_client: Any) -> Iterator[Callable[[str], Path]]:
    """Fresh project copies for one Docker test; their images are removed after it."""
    yield lambda name: copy_project(name, tmp_path)
    remove_project_images(docker_client, tmp_path)


@pytest.fixture(autouse=True)
def _docker_marker(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("docker") is not None:
        request.getfixturevalue("base_image")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """With ``ABEJA_REQUIRE_DOCKER=1`` a skipped Docker test fails: CI must really run them."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if REQUIRE_DOCKER and report.skipped and item.get_closest_marker("docker") is not None:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"ABEJA_REQUIRE_DOCKER=1, but this Docker test was skipped: {reason}"


@pytest.fixture(scope="session")
def production_image(
    docker_projects: Callable[[str], Path], base_image: str, docker_client: Any
) -> Iterator[tuple[str, Path]]:
    """``abeja model build`` of the ``replica`` project, once per session: (tag, project);
    removed (with its containers) at the end."""
    cwd = docker_projects("replica")
    tag = f"abeja-test/replica:{secrets.token_hex(4)}"
    result = run_abeja(
        "model", "build", "-h", "main:handler", "-i", base_image, "-t", tag,
        "-e", "BAKED=yes", cwd=cwd,
    )  # fmt: skip
    assert result.returncode == 0, str(result)
    yield tag, cwd
    for container in docker_client.containers.list(all=True, filters={"ancestor": tag}):
        container.remove(force=True)
    docker_client.images.remove(tag, force=True)
