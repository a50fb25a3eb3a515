"""The Docker engine end to end: real images, real containers, checked with the Docker SDK.

Projects are shared across this module where the test is not about the image cache, so each
image is built once per session. After every test no container of ours may be left.
"""

from __future__ import annotations

import ipaddress
import json
import re
import signal
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import (
    CHATTY_RUN,
    CLI_TIMEOUT,
    HELD_WHEEL,
    LABEL,
    CliProcess,
    HeldIndex,
    Result,
    assert_flipped,
    chatty_run,
    cli_env,
    http_request,
    ours,
)

from abeja_cli.docker_engine import docker_host
from abeja_runtime.launch import free_port

from .docker_relay import DockerRelay

pytestmark = pytest.mark.docker

Abeja = Callable[..., Result]
Projects = Callable[[str], Path]


@pytest.fixture
def run(abeja: Abeja, base_image: str, docker_client: Any) -> Iterator[Callable[..., Result]]:
    """``run(cwd, *args)``: ``abeja model run-local -i $BASE_IMAGE --engine docker ...``."""
    used: list[Path] = []

    def call(cwd: Path, *args: str, **kwargs: Any) -> Result:
        used.append(cwd)
        return abeja(
            "model", "run-local", "-i", base_image, "--engine", "docker", *args,
            cwd=cwd, **kwargs,
        )  # fmt: skip

    yield call
    for cwd in used:
        assert ours(docker_client, cwd) == [], f"a container of {cwd} was left behind"


def project_image(client: Any, cwd: Path) -> str:
    found = ours(client, cwd, "images")
    assert len(found) == 1, found
    return str(found[0].id)


def test_tax_sample(run: Callable[..., Result], docker_projects: Projects) -> None:
    cwd = docker_projects("tax")
    result = run(cwd, "-h", "main:handler", "--input", "request.json")
    assert result.returncode == 0, str(result)
    assert result.text == '{\n    "total": 108.0\n}\n'
    assert "access: POST / 200" in result.stderr
    bad = run(cwd, "-h", "main:handler", "--input", "bad_request.json", "-q")
    assert bad.returncode == 1, str(bad)
    assert json.loads(bad.stdout) == {"message": "total_without_tax is need"}


def test_run_batch_runs_in_a_container_and_leaves_none(
    abeja: Abeja, base_image: str, docker_client: Any, docker_projects: Projects, tmp_path: Path
) -> None:
    cwd = docker_projects("tax")
    inputs = tmp_path / "in put"  # a space: mounts keep awkward paths whole
    inputs.mkdir()
    (inputs / "a.json").write_text('{"total_without_tax": 10}')
    (inputs / "b.json").write_text('{"total_without_tax": 20}')
    output = tmp_path / "answers"
    batch = ("model", "run-batch", "-i", base_image, "--engine", "docker", "-h", "main:handler")

    result = abeja(*batch, str(inputs), "--output", str(output), cwd=cwd)
    assert result.returncode == 0, str(result)
    assert json.loads((output / "a.json.json").read_text()) == {"total": 10.8}
    assert json.loads((output / "b.json.json").read_text()) == {"total": 21.6}
    assert "2 input(s): 2 answered 2xx" in result.stderr
    assert f"answers in {output}" in result.stderr  # the user's folder, not the container's

    one = abeja(*batch, "-q", "-e", 'INPUT={"other": 1}', cwd=cwd)
    assert one.returncode == 1, str(one)  # the answer is a 400
    assert json.loads(one.stdout) == {"message": "total_without_tax is need"}
    assert ours(docker_client, cwd) == [], "a batch container was left behind"


def test_image_flip_sample(run: Callable[..., Result], docker_projects: Projects) -> None:
    cwd = docker_projects("image_flip")  # requirements.txt: Pillow, installed in the image
    result = run(cwd, "-h", "main:handler", "--input", "cat.jpg", "-q")
    assert result.returncode == 0, str(result)
    assert result.stderr == ""
    assert_flipped(cwd / "cat.jpg", result.stdout)


def test_environment_and_mount(run: Callable[..., Result], docker_projects: Projects) -> None:
    cwd = docker_projects("responder")
    (cwd / "docker.env").write_text("FROM_FILE=file\nOVERRIDDEN=file\n")
    result = run(
        cwd, "-h", "main:describe", "-q", "--input", "request.json",
        "-e", "FROM_E=1", "-e", "FROM_COLON:x:y", "-e", "OVERRIDDEN=option",
        "--env-file", "docker.env", "-o", "org-9",
    )  # fmt: skip
    assert result.returncode == 0, str(result)
    seen = json.loads(result.stdout)
    assert seen["env"] == {
        "HANDLER": "main:describe",
        "ABEJA_TRAINING_RESULT_DIR": "/srv/app/abejainc_training_result",
        "ABEJA_ORGANIZATION_ID": "org-9",
        "FROM_E": "1",
        "FROM_COLON": "x:y",
        "FROM_FILE": "file",
        "OVERRIDDEN": "option",
        "PYTHONUNBUFFERED": "1",
    }
    assert seen["cwd"] == "/srv/app"
    assert seen["body"] == (cwd / "request.json").read_text()


def test_edits_are_live_without_a_rebuild(
    run: Callable[..., Result], docker_projects: Projects, docker_client: Any
) -> None:
    cwd = docker_projects("responder")
    live = cwd / "live.py"
    answers = []
    for word in ("first", "second"):
        live.write_text(f"def handler(request, context):\n    return {{'content': {word!r}}}\n")
        result = run(cwd, "-h", "live:handler", "--input", "request.json")
        assert result.returncode == 0, str(result)
        answers.append(result.stdout)
        image = project_image(docker_client, cwd)
    assert answers == [b"first", b"second"]
    assert "[info] using the cached image" in result.stderr
    assert project_image(docker_client, cwd) == image


def test_import_failure_shows_the_container_log(
    run: Callable[..., Result], docker_projects: Projects
) -> None:
    result = run(
        docker_projects("responder"), "-h", "broken:handler", "--input", "request.json", "-q"
    )
    assert result.returncode == 1, str(result)
    assert result.error_lines() == [
        "[error] the model server stopped before it was ready (exit code 1); its log says why "
        "(often the handler failed to import)"
    ], str(result)
    assert " ------ Local Server Error ------ " in result.stderr
    assert "abeja_test_missing_module" in result.stderr


def test_interrupt_removes_the_container(
    start_abeja: Callable[..., CliProcess],
    docker_projects: Projects,
    base_image: str,
    docker_client: Any,
) -> None:
    cwd = docker_projects("responder")
    cli = start_abeja(
        "model", "run-local", "-i", base_image, "--engine", "docker",
        "-h", "slow:handler", "--input", "request.json", cwd=cwd,
    )  # fmt: skip
    cli.wait_for(r"\[info\] sending request to model")
    assert len(ours(docker_client, cwd)) == 1
    cli.send(signal.SIGINT)
    assert cli.wait(60) == 130, cli.output()
    assert ours(docker_client, cwd) == []


def test_server_publishes_on_loopback_and_stops_cleanly(
    start_abeja: Callable[..., CliProcess],
    docker_projects: Projects,
    base_image: str,
    docker_client: Any,
) -> None:
    cwd = docker_projects("tax")
    cli = start_abeja(
        "model", "run-local-server", "-i", base_image, "--engine", "docker", "-h", "main:handler",
        cwd=cwd,
    )  # fmt: skip
    endpoint = cli.endpoint()
    (container,) = ours(docker_client, cwd)
    bindings = container.attrs["HostConfig"]["PortBindings"]
    assert bindings == {
        "5000/tcp": [{"HostIp": "127.0.0.1", "HostPort": endpoint.rsplit(":", 1)[1]}]
    }
    assert [m["Destination"] for m in container.attrs["Mounts"]] == ["/srv/app"]
    assert container.attrs["Mounts"][0]["Source"] == str(cwd)
    assert container.labels[f"{LABEL}.project"] == str(cwd)
    assert http_request(endpoint, b'{"total_without_tax": 1000}') == (200, b'{"total": 1080.0}')
    # The image's runtime came with uvloop, and serves on it (issue 31: it ran on asyncio).
    assert "loop=uvloop" in container.logs().decode(), container.logs().decode()

    cli.send(signal.SIGINT)
    assert cli.wait(60) == 0, cli.output()
    assert ours(docker_client, cwd) == []


def test_reload_reloads_the_runtime_in_its_container(
    start_abeja: Callable[..., CliProcess],
    docker_projects: Projects,
    base_image: str,
    docker_client: Any,
) -> None:
    cwd = docker_projects("responder")
    module = cwd / "reloaded.py"
    module.write_text("def handler(request, context):\n    return {'content': 'before'}\n")
    cli = start_abeja(
        "model", "run-local-server", "-i", base_image, "--engine", "docker",
        "-h", "reloaded:handler", "--reload", cwd=cwd,
    )  # fmt: skip
    endpoint = cli.endpoint()
    assert http_request(endpoint, b"{}") == (200, b"before")
    (container,) = ours(docker_client, cwd)
    mark = cli.mark()
    module.write_text("def handler(request, context):\n    return {'content': 'after!'}\n")
    cli.wait_for(r"the model server serves the new version at " + endpoint, since=mark, timeout=60)
    assert http_request(endpoint, b"{}") == (200, b"after!")
    assert [c.id for c in ours(docker_client, cwd)] == [container.id]  # reloaded, not restarted
    container.reload()
    assert container.attrs["RestartCount"] == 0 and container.status == "running"

    cli.send(signal.SIGTERM)
    assert cli.wait(60) == 0, cli.output()
    assert ours(docker_client, cwd) == []


def test_gpu_request(
    run: Callable[..., Result], docker_projects: Projects, docker_client: Any
) -> None:
    result = run(
        docker_projects("tax"), "-h", "main:handler", "--input", "request.json", "-d", "x86_gpu"
    )
    if "nvidia" in (docker_client.info().get("Runtimes") or {}):
        assert result.returncode == 0, result  # an engine that has GPUs runs it
        return
    assert result.returncode == 1, str(result)
    (line,) = result.error_lines()
    assert line.startswith("[error] Docker cannot give the container a GPU (-d x86_gpu) (")
    assert line.endswith(
        "this machine needs an NVIDIA GPU and the NVIDIA Container Toolkit (install it, then "
        "restart Docker); or run with -d x86_cpu"
    )


@pytest.fixture
def relay(tmp_path: Path, docker_client: Any) -> Iterator[DockerRelay]:
    """The engine's socket relayed: ``relay.started`` is each container as it was started."""
    engine = docker_host()
    if not engine.startswith("unix://"):
        pytest.skip(f"the relay passes on a unix socket only; Docker is at {engine}")
    relay = DockerRelay(tmp_path, docker_client, engine.removeprefix("unix://"))
    yield relay
    relay.close()


@pytest.mark.parametrize(
    ("command", "gpus", "count", "ids"),
    [
        ("run-local", "all", -1, []),
        ("run-local", "2", 2, []),
        ("run-local-server", "device=0,1", 0, ["0", "1"]),
    ],
)
def test_gpus_are_asked_of_docker_and_a_machine_without_says_so(
    abeja: Abeja,
    base_image: str,
    docker_client: Any,
    docker_projects: Projects,
    relay: DockerRelay,
    command: str,
    gpus: str,
    count: int,
    ids: list[str],
) -> None:
    """``--gpus`` is the device request ``docker run --gpus`` makes; where the engine has no
    GPU (this machine), the start fails with one sentence and the container is removed."""
    cwd = docker_projects("tax")
    result = abeja(
        "model", command, "-i", base_image, "--engine", "docker", "-h", "main:handler",
        *(["--input", "request.json"] if command == "run-local" else []), "--gpus", gpus,
        cwd=cwd, env=cli_env(DOCKER_HOST=relay.host),
    )  # fmt: skip
    (container,) = relay.started
    (request,) = container["HostConfig"]["DeviceRequests"]
    assert request["Count"] == count
    assert (request["DeviceIDs"] or []) == ids
    assert request["Capabilities"] == [["gpu"]]
    assert "ABEJA_RUNTIME_DRAIN_DELAY=0" in container["Config"]["Env"]  # nothing balances here
    assert ours(docker_client, cwd) == [], "the container was left behind"
    if "nvidia" in (docker_client.info().get("Runtimes") or {}):
        return  # an engine that has GPUs ran it
    assert result.returncode == 1, str(result)
    assert result.error_lines() == [
        f"[error] Docker cannot give the container the GPUs of --gpus {gpus} (could not select "
        'device driver "" with capabilities: [[gpu]]): this machine needs an NVIDIA GPU and the '
        "NVIDIA Container Toolkit (install it, then restart Docker); or run without --gpus"
    ], str(result)


def test_a_local_run_has_no_drain_delay_unless_given(
    run: Callable[..., Result], docker_projects: Projects
) -> None:
    """Nothing balances in front of the container: its stop need not wait (issue 31)."""
    cwd = docker_projects("responder")
    (cwd / "names.json").write_text('["ABEJA_RUNTIME_DRAIN_DELAY"]')
    seen = []
    for given in ([], ["-e", "ABEJA_RUNTIME_DRAIN_DELAY=2.5"]):
        result = run(cwd, "-h", "main:variables", "-q", "--input", "names.json", *given)
        assert result.returncode == 0, str(result)
        seen.append(json.loads(result.stdout)["ABEJA_RUNTIME_DRAIN_DELAY"])
    assert seen == ["0", "2.5"]


def test_a_pipfile_is_installed_in_the_image(
    run: Callable[..., Result], docker_tmp_projects: Projects
) -> None:
    """ABEJA's handler guide allows "requirements.txt (or Pipfile)"."""
    cwd = docker_tmp_projects("responder")
    (cwd / "needs.py").write_text(
        "import importlib.metadata\n\nimport tinydb\n\n\ndef handler(request, context):\n"
        "    return {'content_type': 'text/plain',\n"
        "            'content': importlib.metadata.version('tinydb')}\n"
    )
    plain = run(cwd, "-h", "main:echo", "--input", "request.json")
    assert plain.returncode == 0, str(plain)
    assert "requirements" not in plain.stderr, "no requirements: no phase that says it installed"
    assert "[info] added the project (" in plain.stderr

    (cwd / "Pipfile").write_text('[packages]\ntinydb = "==4.8.0"\n')
    result = run(cwd, "-h", "needs:handler", "--input", "request.json")
    assert result.returncode == 0, str(result)
    assert result.stdout == b"4.8.0"
    assert "[info] installed the project's requirements (" in result.stderr


def test_the_project_is_at_mnt_project_too(
    run: Callable[..., Result], docker_tmp_projects: Projects
) -> None:
    """Cortex handlers open their files at /mnt/project/ (Cortex's own containers' path)."""
    cwd = docker_tmp_projects("responder")
    (cwd / "config.json").write_text('{"threshold": 0.5}')
    (cwd / "cortexish.py").write_text(
        "def handler(request, context):\n"
        "    with open('/mnt/project/config.json') as file:\n"
        "        return {'content_type': 'application/json', 'content': file.read()}\n"
    )
    result = run(cwd, "-h", "cortexish:handler", "--input", "request.json", "-q")
    assert result.returncode == 0, str(result)
    assert json.loads(result.stdout) == {"threshold": 0.5}


def test_parallel_first_builds_make_one_image(
    run: Callable[..., Result], docker_tmp_projects: Projects, docker_client: Any
) -> None:
    """Two commands that need the same new image: one builds it, the other waits and uses it
    (two builds left the first image untagged, a dangling image that clean never named)."""
    cwd = docker_tmp_projects("tax")
    with ThreadPoolExecutor(2) as pool:
        results = list(
            pool.map(lambda _: run(cwd, "-h", "main:handler", "--input", "request.json"), range(2))
        )
    for result in results:
        assert result.returncode == 0, str(result)
    assert sum("[info] building the image " in result.stderr for result in results) == 1
    assert sum("[info] using the cached image" in result.stderr for result in results) == 1
    project_image(docker_client, cwd)  # exactly one, tagged or not


# -- the image cache ----------------------------------------------------------------------


def test_image_cache(
    run: Callable[..., Result],
    docker_tmp_projects: Projects,
    docker_client: Any,
    base_image: str,
) -> None:
    cwd = docker_tmp_projects("tax")
    (cwd / "requirements.txt").write_text("click\n")  # already in the image: no network needed
    args = ("-h", "main:handler", "--input", "request.json")

    first = run(cwd, *args)
    assert first.returncode == 0, str(first)
    assert "[info] building the image abeja-local/tax-" in first.stderr
    # One line per phase with its time; the build's own output only with -v.
    assert re.search(r"\[info\] installed the project's requirements \(\d+\.\d s\)", first.stderr)
    assert re.search(r"\[info\] added the project \(\d+\.\d s\)", first.stderr), first.stderr
    assert "Step 1/" not in first.stderr
    built = project_image(docker_client, cwd)
    labels = docker_client.images.get(built).labels
    assert labels[f"{LABEL}.project"] == str(cwd)
    assert labels[f"{LABEL}.base-image"] == base_image
    assert len(labels[f"{LABEL}.requirements-sha256"]) == 64
    assert labels[f"{LABEL}.runtime-version"].startswith("0.")

    again = run(cwd, *args)
    assert again.returncode == 0, str(again)
    assert "[info] using the cached image" in again.stderr
    assert "Step 1/" not in again.stderr
    assert project_image(docker_client, cwd) == built

    quiet = run(cwd, *args, "-q")
    assert quiet.stderr == ""

    (cwd / "requirements.txt").write_text("click  # changed\n")
    changed = run(cwd, *args, "-v")
    assert "[info] building the image" in changed.stderr, changed
    assert "Step 1/" in changed.stderr  # -v: the whole build output
    rebuilt = project_image(docker_client, cwd)  # exactly one: the stale one was removed
    assert rebuilt != built

    forced = run(cwd, *args, "--no-cache")
    assert forced.returncode == 0, str(forced)
    assert "Using cache" not in forced.stderr
    assert project_image(docker_client, cwd) != rebuilt

    other = docker_tmp_projects("tax")  # same files, another folder: another image
    elsewhere = run(other, *args)
    assert "[info] building the image" in elsewhere.stderr, elsewhere
    assert project_image(docker_client, other) != project_image(docker_client, cwd)


def test_a_long_install_says_what_pip_is_doing(
    start_abeja: Callable[..., CliProcess],
    held_index: Callable[..., HeldIndex],
    docker_tmp_projects: Projects,
    docker_client: Any,
    base_image: str,
) -> None:
    """pip in the build (here held on a download from an index on this machine, reached
    through the bridge's gateway) is named in the progress lines, not only the time."""
    config = docker_client.networks.get("bridge").attrs["IPAM"]["Config"][0]
    gateway = config.get("Gateway") or str(next(ipaddress.ip_network(config["Subnet"]).hosts()))
    index = held_index(gateway)
    cwd = docker_tmp_projects("tax")
    (cwd / "requirements.txt").write_text(index.requirements(gateway))
    cli = start_abeja(
        "model", "run-local", "-i", base_image, "--engine", "docker", "-h", "main:handler",
        "--input", "request.json", cwd=cwd,
    )  # fmt: skip
    line = cli.wait_for(r"^\[info\] installing the project's requirements\.\.\. \(")
    index.release()
    assert re.fullmatch(
        r"\[info\] installing the project's requirements\.\.\. \(\d+ s; pip: Downloading "
        rf"{re.escape(HELD_WHEEL)} \(.+\)\)",
        line,
    ), line
    assert cli.wait(CLI_TIMEOUT) == 0, cli.output()
    assert json.loads("".join(cli.stdout)) == {"total": 108.0}
    assert ours(docker_client, cwd) == []


def test_large_files_going_into_the_image_are_named(
    run: Callable[..., Result], docker_tmp_projects: Projects
) -> None:
    """A large file left in the project is copied into the image: said, with the largest
    files and .dockerignore; what .dockerignore leaves out is not counted."""
    cwd = docker_tmp_projects("tax")
    for name, size in (("weights.bin", 55), ("data/video.mp4", 60), ("notes.bin", 2)):
        (cwd / name).parent.mkdir(exist_ok=True)
        with (cwd / name).open("wb") as sparse:  # zeros, without writing them
            sparse.truncate(size * 1000 * 1000)
    (cwd / ".dockerignore").write_text("data/\n")
    result = run(cwd, "-h", "main:handler", "--input", "request.json")
    assert result.returncode == 0, str(result)
    warnings = [line for line in result.stderr.splitlines() if line.startswith("[warning]")]
    assert warnings == [
        "[warning] 57 MB of the project's files are copied into the image; the largest: "
        "weights.bin (55 MB), notes.bin (2 MB). List the ones the model does not need in "
        f"{cwd}/.dockerignore (a path or pattern a line) to leave them out"
    ], result.stderr


def test_failing_build_shows_pip_error(
    run: Callable[..., Result], docker_tmp_projects: Projects, docker_client: Any
) -> None:
    cwd = docker_tmp_projects("tax")
    # --no-index makes pip fail at once, without the network.
    (cwd / "requirements.txt").write_text("--no-index\nabeja-no-such-package==1.0\n")
    result = run(cwd, "-h", "main:handler", "--input", "request.json")
    assert result.returncode == 1, str(result)
    # The build's output was not shown live (no -v): it comes after the error line.
    assert " ------ Build Log ------ " in result.stderr
    assert "No matching distribution found for abeja-no-such-package==1.0" in result.stderr
    assert result.error_lines() == [
        "[error] pip could not install the project's requirements.txt (see its error in the "
        "build log); fix the file and run again"
    ]
    assert ours(docker_client, cwd, "images") == []
    # The layers of the steps that did succeed are not left behind either (layers of this
    # build only: other test processes build and replace images meanwhile).
    layers = set(re.findall(r"---> ([0-9a-f]{12})$", result.stderr, re.MULTILINE))
    assert layers, "the build log names no layer"
    dangling = docker_client.api.images(filters={"dangling": True}, quiet=True)
    dangling = {image.removeprefix("sha256:")[:12] for image in dangling}
    assert not layers & dangling, layers & dangling
    quiet = run(cwd, "-h", "main:handler", "--input", "request.json", "-q")
    assert quiet.returncode == 1
    # With -q the build log was not shown live: it comes after the error line.
    assert " ------ Build Log ------ " in quiet.stderr
    assert "No matching distribution found" in quiet.stderr


def test_missing_base_image_is_one_error(
    abeja: Abeja, docker_projects: Projects, docker_client: Any
) -> None:
    """A base image that is neither present nor pullable (here: a registry on a closed local
    port, which also shows that ``host:port/name:tag`` references are understood)."""
    cwd = docker_projects("tax")
    image = "127.0.0.1:9/abeja-test-absent:1"
    result = abeja(
        "model", "run-local", "-i", image, "--engine", "docker", "-h", "main:handler",
        "--input", "request.json", cwd=cwd, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1, str(result)
    (line,) = result.error_lines()
    assert line.startswith(f"[error] base image {image} is not present locally and could not be")
    assert line.endswith(
        "choose an image you have (docker images lists them) with -i, or once for every command "
        "with ABEJA_IMAGE (in the environment or the project's .env), or run the model without "
        "Docker with --engine local"
    )
    assert f"[info] base image {image} is not present locally; pulling it" in result.stderr
    assert ours(docker_client, cwd) == []


def test_without_the_runtime_source_docker_is_not_used(
    abeja: Abeja, project: Callable[[str], Path], tmp_path: Path
) -> None:
    """An install without this checkout cannot build images: the CLI says so and runs the
    model locally, unless Docker was asked for."""
    from helpers.cli import cli_env

    env = cli_env(ABEJA_RUNTIME_SOURCE=str(tmp_path / "nowhere"))
    cwd = project("tax")
    auto = abeja("model", "run-local", "-h", "main:handler", "--input", "request.json", "-q",
                 cwd=cwd, env=env)  # fmt: skip
    assert auto.returncode == 0, str(auto)
    assert json.loads(auto.stdout) == {"total": 108.0}
    assert auto.stderr == "", "-q prints the answer only"
    told = abeja("model", "run-local", "-h", "main:handler", "--input", "request.json",
                 cwd=cwd, env=env)  # fmt: skip
    assert (
        f"[info] cannot build images: the abeja-runtime source is not at {tmp_path}/nowhere"
    ) in told.stderr
    assert "running the model with the local engine instead (--engine local)\n" in told.stderr
    forced = abeja("model", "run-local", "-h", "main:handler", "--input", "request.json",
                   "--engine", "docker", cwd=cwd, env=env)  # fmt: skip
    assert forced.returncode == 1, str(forced)
    (line,) = forced.error_lines()
    assert line.endswith(
        "set ABEJA_RUNTIME_SOURCE to a checkout of abeja-runtime, or use --engine local"
    )


def test_awkward_project_path(
    run: Callable[..., Result], tmp_path: Path, docker_client: Any
) -> None:
    """Spaces, ``$``, quotes, ``:`` and non-ASCII in the project path: the mount, the labels
    and the cache lookup all keep the path exact."""
    import shutil

    from helpers.cli import SAMPLES, remove_project_images

    cwd = tmp_path / "my 'proj' $HOME é:1"
    shutil.copytree(SAMPLES / "tax", cwd)
    try:
        first = run(cwd, "-h", "main:handler", "--input", "request.json")
        assert first.returncode == 0, str(first)
        assert json.loads(first.stdout) == {"total": 108.0}
        image = docker_client.images.get(project_image(docker_client, cwd))
        assert image.labels[f"{LABEL}.project"] == str(cwd)
        again = run(cwd, "-h", "main:handler", "--input", "request.json")
        assert "[info] using the cached image" in again.stderr, str(again)
    finally:
        remove_project_images(docker_client, tmp_path)


def test_a_container_left_by_a_killed_cli_is_removed_by_the_next_run(
    start_abeja: Callable[..., CliProcess],
    run: Callable[..., Result],
    docker_projects: Projects,
    docker_client: Any,
    base_image: str,
) -> None:
    cwd = docker_projects("tax")
    server = ("model", "run-local-server", "-i", base_image, "--engine", "docker",
              "-h", "main:handler", "-p", str(free_port()))  # fmt: skip
    cli = start_abeja(*server, cwd=cwd)
    cli.endpoint()
    (left,) = ours(docker_client, cwd)
    cli.send(signal.SIGKILL)
    cli.wait(30)
    assert [c.id for c in ours(docker_client, cwd)] == [left.id]  # the orphan

    # The same command again: the orphan holds its port, and is removed first (by this run,
    # or by a run of another test process: every run removes the orphans of this machine).
    again = start_abeja(*server, cwd=cwd)
    again.endpoint()
    assert left.id not in [c.id for c in ours(docker_client, cwd)]
    again.send(signal.SIGKILL)
    again.wait(30)

    result = run(cwd, "-h", "main:handler", "--input", "request.json")
    assert result.returncode == 0, str(result)
    assert ours(docker_client, cwd) == [], "the second orphan was not removed"


def test_a_streamed_answer_arrives_chunk_by_chunk_from_the_container(
    start_abeja: Callable[..., CliProcess], docker_projects: Projects, base_image: str
) -> None:
    """run-local-server with Docker: the handler's second line is produced only once the
    client has read the first, through the container's published port (issue 29)."""
    import socket

    cwd = docker_projects("responder")
    release = cwd / "release-streamed"  # the project folder is the container's /srv/app
    release.unlink(missing_ok=True)
    cli = start_abeja(
        "model", "run-local-server", "-i", base_image, "--engine", "docker",
        "-h", "main:held_stream", "-e", "RELEASE=/srv/app/release-streamed", cwd=cwd,
    )  # fmt: skip
    host, port = cli.endpoint().removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        data = b""
        while b"first\n" not in data:
            chunk = sock.recv(4096)
            assert chunk, data
            data += chunk
        assert b"second" not in data
        release.touch()
        while b"second\n" not in data:
            chunk = sock.recv(4096)
            assert chunk, data
            data += chunk
    release.unlink()


def test_the_log_comes_in_the_order_it_was_written(
    run: Callable[..., Result], docker_projects: Projects
) -> None:
    """As with the local engine (its test of this name), and the handler's lines on stderr
    among its prints: Docker reads a container's stdout and its stderr apart."""
    result = run(docker_projects("responder"), "-h", "main:chatty", "--input", "request.json")
    assert result.returncode == 0, str(result)
    assert chatty_run(result.stderr) == CHATTY_RUN, str(result)
    assert result.text == "done"


def test_the_chat_template_streams_openai_chunks_from_a_container(
    abeja: Abeja,
    start_abeja: Callable[..., CliProcess],
    base_image: str,
    docker_client: Any,
    tmp_path: Path,
) -> None:
    """``abeja model init --template chat``, served by the Docker engine: run-local answers
    the chat completion, run-local-server streams OpenAI's chunks to the openai client."""
    import openai

    assert abeja("model", "init", "chat", "--template", "chat", cwd=tmp_path).returncode == 0
    cwd = tmp_path / "chat"
    once = abeja(
        "model", "run-local", "-i", base_image, "--engine", "docker", "-h", "main:chat",
        "--input", "request.json", "-q", cwd=cwd,
    )  # fmt: skip
    assert once.returncode == 0, str(once)
    whole = json.loads(once.stdout)["choices"][0]["message"]["content"]
    cli = start_abeja(
        "model", "run-local-server", "-i", base_image, "--engine", "docker", "-h", "main:chat",
        cwd=cwd,
    )  # fmt: skip
    request = json.loads((cwd / "request.json").read_text())
    url = cli.endpoint() + "/v1"
    with openai.OpenAI(base_url=url, api_key="unused", max_retries=0) as client:
        stream = client.chat.completions.create(**request, stream=True)
        assert "".join(chunk.choices[0].delta.content or "" for chunk in stream) == whole
    cli.send(signal.SIGINT)
    assert cli.wait(60) == 0, cli.output()
    assert ours(docker_client, cwd) == []
