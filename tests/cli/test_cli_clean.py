"""``abeja model clean``: the project's run-local images, stopped containers and local-engine
environments go, what runs stays (and is said to), and ``--dry-run`` removes nothing."""

from __future__ import annotations

import contextlib
import re
import secrets
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import LABEL, CliProcess, Result, cli_env, ours


@pytest.mark.docker
def test_clean_removes_the_projects_images_and_stopped_containers(
    abeja: Callable[..., Result],
    base_image: str,
    docker_client: Any,
    docker_tmp_projects: Callable[[str], Path],
) -> None:
    cwd = docker_tmp_projects("tax")
    built = abeja("model", "run-local", "-i", base_image, "--engine", "docker",
                  "-h", "main:handler", "--input", "request.json", "-q", cwd=cwd)  # fmt: skip
    assert built.returncode == 0, str(built)
    (image,) = ours(docker_client, cwd, "images")
    labels = {f"{LABEL}.kind": "container", f"{LABEL}.project": str(cwd)}
    # What a killed CLI would leave: a stopped container, and one still running.
    stopped = docker_client.containers.create(image.id, labels=labels)
    running = docker_client.containers.run(image.id, detach=True, labels=labels)
    try:
        dry = abeja("model", "clean", "--dry-run", cwd=cwd)
        assert dry.returncode == 0, str(dry)
        assert "would remove image" in dry.stderr and "would free up to" in dry.stderr
        assert len(ours(docker_client, cwd, "images")) == 1

        cleaned = abeja("model", "clean", cwd=cwd)
        assert cleaned.returncode == 0, str(cleaned)
        assert f"removing container {stopped.name}" in cleaned.stderr
        assert f"keeping container {running.name}: it is running" in cleaned.stderr
        # The running container still uses the image, so Docker keeps it; nothing is forced.
        assert "keeping image" in cleaned.stderr
        assert [c.id for c in ours(docker_client, cwd)] == [running.id]
    finally:
        running.remove(force=True)

    again = abeja("model", "clean", cwd=cwd)
    assert again.returncode == 0, str(again)
    assert "removed image" in again.stderr and "freed up to" in again.stderr
    assert ours(docker_client, cwd, "images") == []
    last = abeja("model", "clean", cwd=cwd)
    assert f"nothing to remove for {cwd}" in last.stderr


@pytest.mark.docker
def test_clean_all_dry_run_removes_nothing(
    abeja: Callable[..., Result],
    base_image: str,
    docker_client: Any,
    docker_tmp_projects: Callable[[str], Path],
) -> None:
    """An image of this test's own (other test processes add and remove theirs meanwhile)."""
    cwd = docker_tmp_projects("tax")
    built = abeja("model", "run-local", "-i", base_image, "--engine", "docker",
                  "-h", "main:handler", "--input", "request.json", "-q", cwd=cwd)  # fmt: skip
    assert built.returncode == 0, str(built)
    (image,) = ours(docker_client, cwd, "images")
    result = abeja("model", "clean", "--all", "--dry-run", cwd=cwd)
    assert result.returncode == 0, str(result)
    assert f"would remove image {image.tags[0]}" in result.stderr, result
    assert [found.id for found in ours(docker_client, cwd, "images")] == [image.id]


@pytest.mark.docker
def test_an_image_a_built_image_uses_is_kept_and_clean_says_why(
    abeja: Callable[..., Result],
    base_image: str,
    docker_client: Any,
    docker_tmp_projects: Callable[[str], Path],
) -> None:
    cwd = docker_tmp_projects("tax")
    tag = f"abeja-test/clean-{secrets.token_hex(4)}:1"
    built = abeja("model", "build", "-h", "main:handler", "-i", base_image, "-t", tag, "-q",
                  cwd=cwd)  # fmt: skip
    assert built.returncode == 0, str(built)
    try:
        (image,) = ours(docker_client, cwd, "images")  # the run-local image it is built on
        kept = abeja("model", "clean", cwd=cwd)
        assert kept.returncode == 0, str(kept)
        assert re.search(
            rf"^\[info\] keeping image {re.escape(image.tags[0])} \(\d+ MB\): {re.escape(tag)}, "
            "made with abeja model build, is built on it; to free it too, remove that image "
            rf"first \(docker rmi {re.escape(tag)}\) and run clean again$",
            kept.stderr,
            re.MULTILINE,
        ), kept.stderr
        assert kept.stderr.splitlines()[-1] == (
            f"[info] removed nothing for {cwd}; kept 1 image, for the reasons above"
        )
        assert [found.id for found in ours(docker_client, cwd, "images")] == [image.id]
    finally:
        docker_client.images.remove(tag, force=True)
    freed = abeja("model", "clean", cwd=cwd)
    assert f"[info] removed image {image.tags[0]} (" in freed.stderr, freed
    assert ours(docker_client, cwd, "images") == []


def test_clean_removes_the_local_engines_environments(
    abeja: Callable[..., Result],
    start_abeja: Callable[..., CliProcess],
    project: Callable[[str], Path],
    tmp_path: Path,
) -> None:
    """Without Docker too: the environments that hold a project's requirements go, this
    project's by default, every project's with --all; one a model runs from stays."""
    cache = tmp_path / "cache"
    env = cli_env(ABEJA_RUNTIME_CACHE=str(cache), DOCKER_HOST=f"unix://{tmp_path}/no.sock")
    mine, other = project("responder"), project("responder")
    for cwd in (mine, other):
        (cwd / "requirements.txt").write_text("click\n")  # installed here: nothing to download
        ran = abeja("model", "run-local", "-h", "main:echo", "--input", "request.json",
                    cwd=cwd, env=env)  # fmt: skip
        assert ran.returncode == 0, str(ran)
    venvs = sorted(cache.glob("venvs/[!.]*"))
    assert len(venvs) == 2, venvs

    waiting = start_abeja("model", "run-local", "-h", "slow:handler", "--input", "request.json",
                          cwd=mine, env=env)  # fmt: skip
    waiting.wait_for(r"^\[info\] sending request to model")
    busy = abeja("model", "clean", cwd=mine, env=env)
    assert busy.returncode == 0, str(busy)
    assert re.search(
        r"^\[info\] keeping the local engine's environment .+: a model runs from it "
        r"\(process \d+\)$",
        busy.stderr,
        re.MULTILINE,
    ), busy.stderr
    assert sorted(cache.glob("venvs/[!.]*")) == venvs
    waiting.send(signal.SIGINT)
    assert waiting.wait(60) == 130, waiting.output()

    dry = abeja("model", "clean", "--dry-run", cwd=mine, env=env)
    assert "[info] would remove the local engine's environment " in dry.stderr, dry
    assert sorted(cache.glob("venvs/[!.]*")) == venvs
    cleaned = abeja("model", "clean", cwd=mine, env=env)
    assert cleaned.returncode == 0, str(cleaned)
    assert f"[info] Docker is not reachable at unix://{tmp_path}/no.sock" in cleaned.stderr
    (left,) = cache.glob("venvs/[!.]*")
    (gone,) = set(venvs) - {left}
    assert f"[info] removed the local engine's environment {gone} (" in cleaned.stderr, cleaned
    assert re.search(
        rf"^\[info\] freed up to \d+ MB \(1 environment\) for {re.escape(str(mine))}; ",
        cleaned.stderr,
        re.MULTILINE,
    ), cleaned.stderr

    everything = abeja("model", "clean", "--all", "--yes", cwd=mine, env=env)
    assert everything.returncode == 0, str(everything)
    assert f"[info] removed the local engine's environment {left} (" in everything.stderr
    assert not any(cache.glob("venvs/[!.]*"))
    with contextlib.suppress(FileNotFoundError):
        assert not any((cache / "venvs").iterdir())
