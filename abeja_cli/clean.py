"""``abeja model clean``: remove the images, stopped containers and environments the CLI made.

Everything the CLI makes in Docker carries ``org.abeja-runtime.*`` labels, so it is found by
label, never by name; the local engine's environments (``venvs.py``) record the project they
were made for. By default only the current project's run-local images, stopped containers and
environments go; ``--all`` also takes every other project's and the shared runtime images.
Running containers stay (a run-local-server in another terminal), so do environments a model
runs from, and the images you built with ``abeja model build``: those are yours, tagged with
your names (and the run-local image they are built on stays with them; clean says so).
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from abeja_cli.console import Console
from abeja_cli.errors import EngineUnavailable
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
    help="Every project's images, stopped containers and environments, and the shared "
    "runtime images.",
)
@click.option("--dry-run", is_flag=True, help="Show what would be removed; remove nothing.")
@click.option(
    "--yes", "-y", is_flag=True, help="With --all: remove without asking (needed off a terminal)."
)
def clean(everything: bool, dry_run: bool, yes: bool) -> None:
    """Remove this project's run-local images, stopped containers and local-engine
    environments, and show what it frees.

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
    what = (
        "every project's run-local images, stopped containers and local-engine environments, "
        "and the runtime images"
    )
    if not sys.stdin.isatty():
        console.error(
            f"clean --all removes {what}; add --yes to confirm (there is no terminal to ask on), "
            "or --dry-run to see the list first"
        )
        sys.exit(2)
    if not click.confirm(f"Remove {what}?", default=False, err=True):
        console.error("nothing was removed")
        sys.exit(1)


@dataclass
class _Tally:
    """What a clean removed (or would remove) and what it kept."""

    dry_run: bool
    removed: dict[str, int]
    kept: dict[str, int]
    freed: int = 0

    @classmethod
    def empty(cls, dry_run: bool) -> _Tally:
        kinds = ("container", "image", "environment")
        return cls(dry_run, dict.fromkeys(kinds, 0), dict.fromkeys(kinds, 0))

    @property
    def verb(self) -> str:
        return "would remove" if self.dry_run else "removed"

    @staticmethod
    def counted(counts: dict[str, int]) -> str:
        return ", ".join(f"{n} {kind}{'s' if n != 1 else ''}" for kind, n in counts.items() if n)


def _clean(console: Console, *, everything: bool, dry_run: bool) -> int:
    from abeja_cli.docker_engine import connect_docker

    project = None if everything else Path.cwd().resolve()
    tally = _Tally.empty(dry_run)
    _remove_environments(console, project, tally)
    try:
        client = connect_docker(timeout=30)
    except EngineUnavailable as exc:
        console.info(f"{exc.reason}: no images or containers were looked at")
    else:
        try:
            label = str(project) if project is not None else None
            _remove_containers(client, console, label, tally)
            _remove_images(client, console, label, tally)
        finally:
            client.close()
    where = "in all projects" if everything else f"for {project}"
    removed, kept = tally.counted(tally.removed), tally.counted(tally.kept)
    held = f"; kept {kept}, for the reasons above" if kept else ""
    if not removed:
        nothing = f"{tally.verb} nothing" if kept else "nothing to remove"
        console.notice(f"{nothing} {where}{held}")
        return 0
    verb = "would free" if dry_run else "freed"
    console.notice(
        f"{verb} up to {_megabytes(tally.freed)} ({removed}) {where}{held}; images share "
        "layers, so the disk space freed may be less"
    )
    return 0


def _remove_environments(console: Console, project: Path | None, tally: _Tally) -> None:
    """The local engine's environments (a project's installed requirements)."""
    from abeja_cli.venvs import environments, running_from, size_of

    for venv in environments(project):
        pid = running_from(venv)
        if pid is not None:
            console.info(f"keeping the local engine's environment {venv}: a model runs from it "
                         f"(process {pid})")  # fmt: skip
            tally.kept["environment"] += 1
            continue
        size = size_of(venv)
        if not tally.dry_run:
            shutil.rmtree(venv, ignore_errors=True)
            if venv.exists():
                console.info(f"keeping the local engine's environment {venv}: it could not be "
                             "removed entirely")  # fmt: skip
                tally.kept["environment"] += 1
                continue
        console.info(f"{tally.verb} the local engine's environment {venv} ({_megabytes(size)})")
        tally.removed["environment"] += 1
        tally.freed += size


def _filters(kind: str, project: str | None) -> dict[str, Any]:
    labels = [f"{LABEL_PREFIX}.kind={kind}"]
    if project is not None:
        labels.append(f"{LABEL_PREFIX}.project={project}")
    return {"label": labels}


def _remove_containers(
    client: docker.DockerClient, console: Console, project: str | None, tally: _Tally
) -> None:
    from docker.errors import NotFound

    # The low-level listings (here and for images): the high-level ones inspect each item
    # again, and fail on one that another command removed in between.
    for container in client.api.containers(all=True, filters=_filters("container", project)):
        name, state = container["Names"][0].lstrip("/"), container["State"]
        if state not in _STOPPED:
            console.info(f"keeping container {name}: it is {state}")
            tally.kept["container"] += 1
            continue
        console.info(f"{'would remove' if tally.dry_run else 'removing'} container {name}")
        if not tally.dry_run:
            try:
                client.api.remove_container(container["Id"], force=True)
            except NotFound:
                continue
        tally.removed["container"] += 1


def _remove_images(
    client: docker.DockerClient, console: Console, project: str | None, tally: _Tally
) -> None:
    from docker.errors import APIError

    gone: set[str] = set()  # removed (or, with --dry-run, would be): no longer a reason to keep
    kinds = _IMAGE_KINDS if project is None else ("project",)
    for kind in kinds:
        for image in client.api.images(filters=_filters(kind, project)):
            name, size = _name(image), int(image.get("Size", 0))
            dependents = [other for id_, other in _built_on(client, kind, image) if id_ not in gone]
            # Docker would refuse to remove an image another is built on: say which, and why.
            reason = _dependents_reason(dependents) if dependents else ""
            if not reason and not tally.dry_run:
                try:
                    client.images.remove(image["Id"], force=False, noprune=False)
                except APIError as exc:  # a container uses it, or a child was made meanwhile
                    reason = _reason(exc)
            if reason:
                console.info(f"keeping image {name} ({_megabytes(size)}): {reason}")
                tally.kept["image"] += 1
                continue
            console.info(f"{tally.verb} image {name} ({_megabytes(size)})")
            gone.add(image["Id"])
            tally.removed["image"] += 1
            tally.freed += size


def _name(image: dict[str, Any]) -> str:
    tags = [tag for tag in image.get("RepoTags") or () if tag != "<none>:<none>"]
    return tags[0] if tags else str(image["Id"]).removeprefix("sha256:")[:12]


def _built_on(
    client: docker.DockerClient, kind: str, image: dict[str, Any]
) -> list[tuple[str, str]]:
    """The images of ours built on this one, as (id, name): a project image's production
    images (they inherit its cache key), a runtime image's project and production images (they
    carry its base image and runtime version)."""
    labels = image.get("Labels") or {}
    if kind == "project":
        wanted = [f"{LABEL_PREFIX}.kind=production", _label(labels, "cache-key")]
    else:
        wanted = [_label(labels, "base-image-id"), _label(labels, "runtime-version")]
    found = []
    for other in client.api.images(filters={"label": wanted}):
        other_kind = (other.get("Labels") or {}).get(f"{LABEL_PREFIX}.kind")
        if other["Id"] != image["Id"] and other_kind in ("project", "production"):
            found.append((str(other["Id"]), _name(other)))
    return sorted(found, key=lambda item: item[1])


def _label(labels: dict[str, str], name: str) -> str:
    return f"{LABEL_PREFIX}.{name}={labels.get(f'{LABEL_PREFIX}.{name}', '')}"


def _dependents_reason(names: list[str]) -> str:
    """Why an image stays: the images built on it, and for those the user built with
    ``abeja model build``, what to do."""
    listed, one = ", ".join(names), len(names) == 1
    if all(name.startswith(("abeja-local/", "abeja-runtime/")) for name in names):
        return f"{listed} {'is' if one else 'are'} built on it"
    return (
        f"{listed}, made with abeja model build, {'is' if one else 'are'} built on it; to free "
        f"it too, remove {'that image' if one else 'those images'} first (docker rmi "
        f"{' '.join(names)}) and run clean again"
    )


def _reason(exc: Exception) -> str:
    text = str(getattr(exc, "explanation", None) or exc)
    return text.splitlines()[0][:160] if text else type(exc).__name__


def _megabytes(size: int) -> str:
    return f"{size / 1e6:.0f} MB"
