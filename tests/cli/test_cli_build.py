"""``abeja model build``: a production image that runs with plain ``docker run``.

Bad input is refused before Docker is even asked; the image built from the ``replica`` test
project is run read-only, as a non-root user, without the CLI, and stopped with SIGTERM.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shlex
import subprocess
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from docker.errors import NotFound
from helpers.cli import REPO, Result, http_request, ours, run_abeja
from helpers.waiting import wait_until

from abeja_cli import images
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


@pytest.fixture
def built_images(
    docker_client: Any, docker_tmp_projects: Callable[[str], Path]
) -> Iterator[list[str]]:
    """The image ids of the production images a test built, and its containers, are removed
    after it: before the project images they are built on, which ``docker_tmp_projects``
    removes."""
    built: list[str] = []
    yield built
    for image in built:
        for container in docker_client.containers.list(all=True, filters={"ancestor": image}):
            container.remove(force=True)
        with contextlib.suppress(NotFound):
            docker_client.images.remove(image, force=True)


def files_in_image(docker_client: Any, image: str) -> dict[str, str]:
    """Every regular file under /srv/app in ``image`` (bytecode left out), by its path there."""
    script = (
        "import json, pathlib\n"
        "app = pathlib.Path('/srv/app')\n"
        "print(json.dumps({p.relative_to(app).as_posix(): p.read_text() for p in app.rglob('*')"
        " if p.is_file() and '__pycache__' not in p.parts}))"
    )
    container = docker_client.containers.run(image, ["python", "-c", script], detach=True)
    try:
        code = container.wait(timeout=TIMEOUT)["StatusCode"]
        output = container.logs(stdout=True, stderr=False).decode()
        errors = container.logs(stdout=False, stderr=True).decode()
    finally:
        container.remove(force=True)
    assert code == 0, errors
    found: dict[str, str] = json.loads(output)
    return found


def files_in_folder(project: Path) -> dict[str, str]:
    """What ``files_in_image`` shows of an image holding this project as it is now: its files,
    and the requirements.txt every project image has (empty when the project has none)."""
    files = {p.relative_to(project).as_posix(): p for p in project.rglob("*") if p.is_file()}
    return {"requirements.txt": "", **{name: path.read_text() for name, path in files.items()}}


@pytest.mark.docker
def test_build_after_run_local_holds_the_project_as_it_is_now(
    docker_tmp_projects: Callable[[str], Path],
    built_images: list[str],
    docker_client: Any,
    base_image: str,
) -> None:
    """run-local caches a project image (the project is mounted over its copy when it runs);
    build must not ship that copy once the folder has changed: edited, added and removed
    files are in the image it builds next, and an unchanged project reuses the cached one."""
    cwd = docker_tmp_projects("tax")
    (cwd / "old.py").write_text("GONE = True\n")
    tag = f"abeja-test/fresh:{secrets.token_hex(4)}"
    run_local = ("model", "run-local", "-i", base_image, "--engine", "docker",
                 "-h", "main:handler", "--input", "request.json")  # fmt: skip
    build_command = ("model", "build", "-i", base_image, "-h", "main:handler", "-t", tag)

    def build() -> tuple[Result, str]:
        result = run_abeja(*build_command, cwd=cwd)
        assert result.returncode == 0, str(result)
        image = str(docker_client.images.get(tag).id)
        built_images.append(image)
        return result, image

    first = run_abeja(*run_local, cwd=cwd)
    assert first.returncode == 0, str(first)
    _, before = build()
    assert files_in_image(docker_client, before) == files_in_folder(cwd)

    main = cwd / "main.py"
    main.write_text(main.read_text().replace("* 1.08", "* 1.10"))
    (cwd / "added.py").write_text("ADDED = True\n")
    (cwd / "old.py").unlink()
    edited = run_abeja(*run_local, cwd=cwd)  # the fast path: the folder is mounted, no rebuild
    assert edited.returncode == 0, str(edited)
    assert json.loads(edited.stdout) == {"total": pytest.approx(110.0)}
    assert "[info] using the cached image" in edited.stderr, str(edited)
    assert "[info] building the image" not in edited.stderr, str(edited)

    rebuilt, after = build()
    assert after != before
    assert files_in_image(docker_client, after) == files_in_folder(cwd)
    assert "the project's files changed since the cached image was built" in rebuilt.stderr
    # The image the tag named before, and the older project image under it, are gone.
    assert f"removed the image {tag} named before this build ({before[7:19]})" in rebuilt.stderr
    with pytest.raises(NotFound):
        docker_client.images.get(before)
    assert len(ours(docker_client, cwd, "images")) == 1

    unchanged, again = build()
    assert again == after
    assert "[info] using the cached image" in unchanged.stderr, str(unchanged)
    assert "holds the project's files as they are now" in unchanged.stderr, str(unchanged)


@pytest.mark.docker
def test_build_after_a_revert_reuses_the_image_that_holds_those_files(
    docker_tmp_projects: Callable[[str], Path],
    built_images: list[str],
    docker_client: Any,
    base_image: str,
) -> None:
    """A production image kept under another name keeps the project image it is built on; when
    the project's files are back to what that one holds, build lands on it again through
    Docker's layer cache (the same image, named again), and run-local runs in it."""
    cwd = docker_tmp_projects("tax")
    repository, version = "abeja-test/revert", secrets.token_hex(4)
    build_command = ("model", "build", "-i", base_image, "-h", "main:handler",
                     "-t", f"{repository}:{version}")  # fmt: skip

    def build() -> tuple[Result, str]:
        result = run_abeja(*build_command, cwd=cwd)
        assert result.returncode == 0, str(result)
        image = str(docker_client.images.get(f"{repository}:{version}").id)
        built_images.append(image)
        return result, image

    _, first = build()
    docker_client.images.get(first).tag(repository, f"{version}-kept")
    main = cwd / "main.py"
    original = main.read_text()
    main.write_text(original.replace("* 1.08", "* 1.10"))
    edited, second = build()
    assert second != first
    assert "removed the image" not in edited.stderr, str(edited)  # it has another name

    main.write_text(original)
    reverted, third = build()
    assert "the project's files changed since the cached image was built" in reverted.stderr
    assert third == first, str(reverted)
    assert files_in_image(docker_client, third) == files_in_folder(cwd)
    assert f"removed the image {repository}:{version} named before this build" in reverted.stderr
    (project_image,) = ours(docker_client, cwd, "images")
    assert any(tag.startswith("abeja-local/tax-") for tag in project_image.tags)

    run_local = run_abeja("model", "run-local", "-i", base_image, "--engine", "docker",
                          "-h", "main:handler", "--input", "request.json", cwd=cwd)  # fmt: skip
    assert run_local.returncode == 0, str(run_local)
    assert "[info] using the cached image" in run_local.stderr, str(run_local)
    assert json.loads(run_local.stdout) == {"total": pytest.approx(108.0)}


def test_project_files_digest_follows_what_goes_into_the_image(tmp_path: Path) -> None:
    """The digest a project image is labelled with changes with every change of the files the
    image gets, and with nothing else."""
    project = tmp_path / "proj"
    for name in ("main.py", "pkg/model.py", "data/big.bin", ".git/HEAD", "__pycache__/m.pyc"):
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(name)
    (project / ".dockerignore").write_text("data\n")
    digest = images.project_files_digest(project)

    # Not in the image, or not kept by it: left out of the digest.
    (project / "data" / "big.bin").write_text("other weights")
    (project / ".git" / "HEAD").write_text("another commit")
    (project / "__pycache__" / "new.pyc").write_text("")
    os.utime(project / "main.py", (0, 0))
    assert images.project_files_digest(project) == digest

    changes: list[Callable[[], object]] = [
        lambda: (project / "main.py").write_text("edited"),
        lambda: (project / "pkg" / "added.py").write_text(""),
        lambda: (project / "pkg" / "added.py").rename(project / "pkg" / "renamed.py"),
        lambda: (project / "pkg" / "renamed.py").unlink(),
        lambda: (project / "main.py").chmod(0o755),
        lambda: (project / "link.py").symlink_to("main.py"),
        lambda: [(project / "link.py").unlink(), (project / "link.py").symlink_to("pkg/model.py")],
        lambda: (project / ".dockerignore").write_text("data\n*.txt\n"),
    ]
    for number, change in enumerate(changes):
        change()
        changed = images.project_files_digest(project)
        assert changed != digest, f"change {number} left the digest as it was"
        digest = changed


def test_project_context_labels_the_digest_of_the_files_it_holds(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    (project / "main.py").write_text("def handler(request, context): ...\n")
    source = images.find_runtime_source()
    with images.project_context(source, project) as context, tarfile.open(fileobj=context) as tar:
        extracted = tar.extractfile("Dockerfile")
        assert extracted is not None
        dockerfile = extracted.read().decode()
        held = tar.extractfile("project/main.py")
        assert held is not None and held.read() == (project / "main.py").read_bytes()
    label = f'"{images.FILES_LABEL}"="{images.project_files_digest(project)}"'
    assert label in dockerfile.splitlines()[-1]


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
