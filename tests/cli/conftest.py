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

import contextlib
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "samples"
PROJECTS = Path(__file__).parent / "projects"
REQUIRE_DOCKER = os.environ.get("ABEJA_REQUIRE_DOCKER") == "1"
BASE_IMAGE = os.environ.get("BASE_IMAGE", "python:3.11-slim")
LABEL = "org.abeja-runtime"
#: Bound on one CLI run. A first Docker build (wheels, runtime image, pip) takes well under it.
CLI_TIMEOUT = 240.0


def cli_env(**extra: str) -> dict[str, str]:
    """The environment for a CLI run: ours, minus variables that would change its behaviour."""
    env = {k: v for k, v in os.environ.items() if k not in ("ABEJA_ENGINE", "HANDLER", "PORT")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


@dataclass(repr=False)
class Result:
    returncode: int
    stdout: bytes
    stderr: str

    @property
    def text(self) -> str:
        return self.stdout.decode("utf-8")

    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith("[error]")]

    def __repr__(self) -> str:  # shown by pytest when an assertion on the result fails
        out = f"--- stdout ---\n{self.stdout!r}\n--- stderr ---\n{self.stderr}"
        return f"exit {self.returncode}\n{out}"


def run_abeja(
    *args: str,
    cwd: Path,
    env: dict[str, str] | None = None,
    stdin: bytes | None = None,
    timeout: float = CLI_TIMEOUT,
) -> Result:
    proc = subprocess.run(
        [sys.executable, "-m", "abeja_cli", *args],
        cwd=cwd,
        env=env or cli_env(),
        input=stdin if stdin is not None else b"",
        capture_output=True,
        timeout=timeout,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr.decode("utf-8", "replace"))


@pytest.fixture
def abeja() -> Callable[..., Result]:
    return run_abeja


@dataclass
class CliProcess:
    """A CLI running in the background; its output lines are collected as they come."""

    process: subprocess.Popen[bytes]
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    _events: queue.Queue[None] = field(default_factory=queue.Queue)

    def _read(self, stream: Any, lines: list[str]) -> None:
        with stream:
            for raw in stream:
                lines.append(raw.decode("utf-8", "replace").rstrip("\n"))
                self._events.put(None)
        self._events.put(None)

    def output(self) -> str:
        return "\n".join(self.stdout) + "\n--- stderr ---\n" + "\n".join(self.stderr)

    def mark(self) -> tuple[int, int]:
        """A position in the output; ``wait_for(..., since=mark)`` looks only after it."""
        return len(self.stdout), len(self.stderr)

    def wait_for(
        self,
        pattern: str,
        *,
        timeout: float = CLI_TIMEOUT,
        stream: str = "any",
        since: tuple[int, int] = (0, 0),
    ) -> str:
        """Block until a line matches ``pattern``; fail if the CLI exits or time runs out."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            lines = []
            if stream in ("any", "stdout"):
                lines += self.stdout[since[0] :]
            if stream in ("any", "stderr"):
                lines += self.stderr[since[1] :]
            for line in lines:
                if regex.search(line):
                    return line
            if self.process.poll() is not None and self._events.empty():
                raise AssertionError(
                    f"CLI exited ({self.process.returncode}) before {pattern!r}:\n{self.output()}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"timed out waiting for {pattern!r}:\n{self.output()}")
            with contextlib.suppress(queue.Empty):
                self._events.get(timeout=min(remaining, 1.0))

    def send(self, sig: int) -> None:
        self.process.send_signal(sig)

    def wait(self, timeout: float = 60.0) -> int:
        code = self.process.wait(timeout)
        return code

    def endpoint(self) -> str:
        line = self.wait_for(r"Endpoint : http://", stream="stdout")
        return line.split("Endpoint : ", 1)[1].strip()


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


def http_request(
    url: str, data: bytes | None = None, *, method: str | None = None, timeout: float = 30.0
) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()


def copy_project(name: str, dest_root: Path) -> Path:
    source = SAMPLES / name if (SAMPLES / name).is_dir() else PROJECTS / name
    dest, n = dest_root / name, 1
    while dest.exists():  # a second copy in the same test is another project
        n += 1
        dest = dest_root / f"{name}-{n}"
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns("__pycache__"))
    return dest.resolve()


@pytest.fixture
def project(tmp_path: Path) -> Callable[[str], Path]:
    """``project("tax")``: a fresh copy of a sample (or of tests/cli/projects/<name>)."""
    return lambda name: copy_project(name, tmp_path)


# -- Docker -------------------------------------------------------------------------------


def _unavailable(reason: str) -> None:
    if REQUIRE_DOCKER:
        pytest.fail(f"ABEJA_REQUIRE_DOCKER=1, but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def docker_client() -> Iterator[Any]:
    import docker
    from docker.errors import DockerException

    try:
        client = docker.from_env(timeout=60)
        client.ping()
    except DockerException as exc:
        _unavailable(f"no Docker engine is reachable ({str(exc)[:120]})")
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
            "tests); set BASE_IMAGE to a local Python 3.10+ image"
        )
    return BASE_IMAGE


def ours(client: Any, project: Path, kind: str = "containers") -> list[Any]:
    """Containers (or images) the CLI made for ``project``, found by their label."""
    filters = {"label": f"{LABEL}.project={project}"}
    if kind == "containers":
        return list(client.containers.list(all=True, filters=filters))
    return list(client.images.list(filters=filters))


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


def remove_project_images(client: Any, root: Path) -> None:
    """Remove the images the CLI built for projects under ``root`` (and their containers)."""
    from docker.errors import APIError

    for image in client.images.list(filters={"label": f"{LABEL}.kind=project"}):
        project = image.labels.get(f"{LABEL}.project", "")
        if project.startswith(str(root)):
            for container in client.containers.list(all=True, filters={"ancestor": image.id}):
                container.remove(force=True)
            with contextlib.suppress(APIError):
                client.images.remove(image.id, force=True)


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
