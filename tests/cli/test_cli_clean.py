"""``abeja model clean``: the project's run-local images and stopped containers go, what runs
stays, and ``--dry-run`` removes nothing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from .helpers import LABEL, Result, ours

pytestmark = pytest.mark.docker


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
