"""The base image (``-i``), set once: ``-i`` beats ``ABEJA_IMAGE`` in the environment, which
beats ``ABEJA_IMAGE`` in the project's ``.env``, which beats the default; so behind a registry
block every generated command works as written.

The images asked for here are on a registry at a closed local port: Docker fails to pull them
at once, and the error names the image that was chosen.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import Result, cli_env, remove_project_images

Abeja = Callable[..., Result]

ABSENT = "127.0.0.1:9/abeja-test-absent"
NO_REGISTRY_HINT = (
    "choose an image you have (docker images lists them) with -i, or once for every command "
    "with ABEJA_IMAGE (in the environment or the project's .env), or "
)


@pytest.mark.docker
@pytest.mark.parametrize(
    ("given", "chosen", "origin"),
    [
        (("flag", "variable", "dotenv"), "flag", ""),
        (("variable", "dotenv"), "variable", " (from ABEJA_IMAGE)"),
        (("dotenv",), "dotenv", " (from ABEJA_IMAGE in {cwd}/.env)"),
    ],
    ids=["flag", "variable", "dotenv"],
)
def test_the_flag_beats_abeja_image_beats_dotenv(
    abeja: Abeja,
    project: Callable[[str], Path],
    given: tuple[str, ...],
    chosen: str,
    origin: str,
) -> None:
    cwd = project("tax")
    flag = ["-i", f"{ABSENT}-flag:1"] if "flag" in given else []
    env = cli_env(ABEJA_IMAGE=f"{ABSENT}-variable:1") if "variable" in given else cli_env()
    if "dotenv" in given:
        (cwd / ".env").write_text(f"# the CLI's settings\nABEJA_IMAGE={ABSENT}-dotenv:1\n")
    result = abeja(
        "model", "build", "-h", "main:handler", "-t", "abeja-test/never:1", *flag,
        cwd=cwd, env=env, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1, str(result)
    (line,) = result.error_lines()
    image = f"{ABSENT}-{chosen}:1{origin.format(cwd=cwd)}"
    assert line.startswith(
        f"[error] base image {image} is not present locally and could not be pulled ("
    ), line
    # As run-local's: the images there are, and how to do without Docker.
    assert line.endswith(
        f"{NO_REGISTRY_HINT}try the model without Docker meanwhile with abeja model run-local "
        "--engine local (build itself needs Docker)"
    ), line


def test_help_names_the_variable_and_the_default(abeja: Abeja, tmp_path: Path) -> None:
    for command in ("run-local", "run-local-server", "run-batch", "build"):
        shown = " ".join(abeja("model", command, "--help", cwd=tmp_path).text.split())
        assert (
            "[env var: ABEJA_IMAGE; default: (ABEJA_IMAGE in ./.env, else python:3.11-slim)]"
        ) in shown, shown


@pytest.mark.docker
def test_the_generated_commands_work_as_written_on_a_local_base_image(
    abeja: Abeja, base_image: str, docker_client: Any, tmp_path: Path
) -> None:
    """Behind a registry block: ``abeja model init``, then ABEJA_IMAGE set once as the
    generated README says (in .env), then the README's commands and init's "try it" line,
    exactly as written, with Docker."""
    name = f"abeja-test-{secrets.token_hex(4)}"
    made = abeja("model", "init", name, cwd=tmp_path)
    assert made.returncode == 0, str(made)
    project = tmp_path / name
    readme = (project / "README.md").read_text()
    commands = [
        shlex.split(line)
        for line in readme.splitlines()
        if line.startswith("abeja model ") and not line.startswith("abeja model run-local-server")
    ]
    assert [argv[2] for argv in commands] == ["run-local", "build"], readme
    assert "ABEJA_IMAGE" in readme and "docker images" in readme, readme
    assert not any("-i" in argv for argv in commands), commands
    (try_it,) = [line for line in made.stderr.splitlines() if line.startswith("[info] try it: ")]
    commands.append(shlex.split(try_it.split(" && ", 1)[1]))
    (tag,) = [argv[argv.index("-t") + 1] for argv in commands if "-t" in argv]
    from docker.errors import ImageNotFound

    with (project / ".env").open("a") as dotenv:  # the README's `echo ABEJA_IMAGE=... >> .env`
        dotenv.write(f"ABEJA_IMAGE={base_image}\n")
    try:
        for argv in commands:
            result = abeja(*argv[1:], cwd=project)
            assert result.returncode == 0, f"{shlex.join(argv)}: {result}"
            assert f"[info] preparing image : {base_image} (from ABEJA_IMAGE in " in result.stderr
            if argv[2] == "run-local":
                assert json.loads(result.stdout) == {"words": 5, "longest": "answering"}
        assert docker_client.images.get(tag).labels["org.abeja-runtime.kind"] == "production"
    finally:
        for container in docker_client.containers.list(all=True, filters={"ancestor": tag}):
            container.remove(force=True)
        with contextlib.suppress(ImageNotFound):
            docker_client.images.remove(tag, force=True)
        remove_project_images(docker_client, tmp_path)
