"""``abeja model clean``: remove the images and stopped containers that the CLI made.

Everything the CLI makes carries ``org.abeja-runtime.*`` labels, so it is found by label, never
by name. By default only the current project's run-local images and its stopped containers
go; ``--all`` also takes every other project's and the shared runtime images. Running
containers stay (a run-local-server in another terminal), and so do the images you built with
``abeja model build``: those are yours, tagged with your names.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from abeja_cli.console import Console
from abeja_cli.images import LABEL_PREFIX
from abeja_cli.session import reported

if TYPE_CHECKING:
    import docker

__all__ = ["clean"]

#: Image kinds removed, children before parents (a project image is built on a runtime image).
_IMAGE_KINDS = ("project", "runtime")
_STOPPED = ("created", "exited", "dead")


@click.command("clean")
@click.option(
    "--all",
    "everything",
    is_flag=True,
    help="Every project's images and stopped containers, and the shared runtime images.",
)
@click.option("--dry-run", is_flag=True, help="Show what would be removed; remove nothing.")
@click.option(
    "--yes", "-y", is_flag=True, help="With --all: remove without asking (needed off a terminal)."
)
def clean(everything: bool, dry_run: bool, yes: bool) -> None:
    """Remove this project's run-local images and stopped containers, and show what it frees.

    \b
    abeja model clean          # the project in the current folder
    abeja model clean --all    # everything the CLI made (asks; images built with `build` stay)
    """
    console = Console()
    if everything and not dry_run and not yes:
        _confirm_all(console)
    reported(console, lambda: _clean(console, everything=everything, dry_run=dry_run))


def _confirm_all(console: Console) -> None:
    """--all reaches beyond this project: asked on a terminal, --yes anywhere else."""
    what = "every project's run-local images and stopped containers, and the runtime images"
    if not sys.stdin.isatty():
        console.error(
            f"clean --all removes {what}; add --yes to confirm (there is no terminal to ask on), "
            "or --dry-run to see the list first"
        )
        sys.exit(2)
    if not click.confirm(f"Remove {what}?", default=False, err=True):
        console.error("nothing was removed")
        sys.exit(1)


def _clean(console: Console, *, everything: bool, dry_run: bool) -> int:
    from abeja_cli.docker_engine import connect_docker

    client = connect_docker(timeout=30)
    try:
        project = None if everything else str(Path.cwd().resolve())
        containers = _remove_containers(client, console, project, dry_run)
        images, freed = _remove_images(client, console, project, dry_run)
    finally:
        client.close()
    where = "in all projects" if everything else f"for {Path.cwd().resolve()}"
    if not containers and not images:
        console.notice(f"nothing to remove {where}")
        return 0
    verb = "would free" if dry_run else "freed"
    console.notice(
        f"{verb} up to {_megabytes(freed)} ({containers} container(s), {images} image(s)) "
        f"{where}; images share layers, so the disk space freed may be less"
    )
    return 0


def _filters(kind: str, project: str | None) -> dict[str, Any]:
    labels = [f"{LABEL_PREFIX}.kind={kind}"]
    if project is not None:
        labels.append(f"{LABEL_PREFIX}.project={project}")
    return {"label": labels}


def _remove_containers(
    client: docker.DockerClient, console: Console, project: str | None, dry_run: bool
) -> int:
    from docker.errors import NotFound

    count = 0
    # The low-level listings (here and for images): the high-level ones inspect each item
    # again, and fail on one that another command removed in between.
    for container in client.api.containers(all=True, filters=_filters("container", project)):
        name, state = container["Names"][0].lstrip("/"), container["State"]
        if state not in _STOPPED:
            console.info(f"keeping container {name}: it is {state}")
            continue
        console.info(f"{'would remove' if dry_run else 'removing'} container {name}")
        if not dry_run:
            try:
                client.api.remove_container(container["Id"], force=True)
            except NotFound:
                continue
        count += 1
    return count


def _remove_images(
    client: docker.DockerClient, console: Console, project: str | None, dry_run: bool
) -> tuple[int, int]:
    """How many images went, and their sizes added up."""
    from docker.errors import APIError

    count = freed = 0
    kinds = _IMAGE_KINDS if project is None else ("project",)
    for kind in kinds:
        for image in client.api.images(filters=_filters(kind, project)):
            tags = [tag for tag in image.get("RepoTags") or () if tag != "<none>:<none>"]
            name = tags[0] if tags else image["Id"].removeprefix("sha256:")[:12]
            size = int(image.get("Size", 0))
            if not dry_run:
                try:
                    client.images.remove(image["Id"], force=False, noprune=False)
                except APIError as exc:  # a container or an image of yours still uses it
                    console.info(f"keeping image {name}: {_reason(exc)}")
                    continue
            console.info(
                f"{'would remove' if dry_run else 'removed'} image {name} ({_megabytes(size)})"
            )
            count += 1
            freed += size
    return count, freed


def _reason(exc: Exception) -> str:
    text = str(getattr(exc, "explanation", None) or exc)
    return text.splitlines()[0][:160] if text else type(exc).__name__


def _megabytes(size: int) -> str:
    return f"{size / 1e6:.0f} MB"
