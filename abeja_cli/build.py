"""``abeja model build``: a production image of the project in the current folder.

The image holds the runtime, the requirements and the project (no mount), runs as a non-root
user on a read-only root filesystem, and checks its own health; see images/production.Dockerfile.
It is built on run-local's cached project image while that holds the project's files as they
are now, so a project tried locally builds again in seconds; after an edit the project image is
built again with the files first (see ``ImageBuilder.production_image``).
"""

from __future__ import annotations

import re
from typing import Any, Final

import click

from abeja_cli.console import Console
from abeja_cli.environment import secret_names
from abeja_cli.errors import InputError
from abeja_cli.session import ModelCommand, ModelOptions, model_options, reported
from abeja_runtime.config import Config

__all__ = ["build", "check_image_tag"]

# Docker's image reference grammar (distribution/reference): lower-case path components
# separated by '/', an optional registry host[:port] first, and an optional :tag.
_COMPONENT: Final = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST: Final = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9-]+)*(?::[0-9]+)?/)"
_REFERENCE: Final = re.compile(
    rf"^(?P<name>{_HOST}?{_COMPONENT}(?:/{_COMPONENT})*)(?::(?P<tag>[\w][\w.-]{{0,127}}))?$"
)
_MAX_NAME: Final = 255


def check_image_tag(tag: str) -> str:
    """The tag as Docker accepts it; :class:`InputError` saying why not otherwise."""
    match = _REFERENCE.match(tag)
    if match is None or len(match.group("name")) > _MAX_NAME:
        raise InputError(
            f"-t {tag!r} is not an image name Docker accepts; use lower-case letters, digits, "
            "'.', '_', '-' and '/', and an optional :TAG (e.g. mymodel:1 or "
            "registry.example.com/team/mymodel:1.0)"
        )
    return tag


@click.command("build", cls=ModelCommand)
@model_options(
    "handler", "image", "environment", "env_file", "organization_id", "no_cache", "v1", "verbose"
)
@click.option(
    "-t",
    "--tag",
    required=True,
    metavar="NAME[:TAG]",
    help="Name of the image to build, e.g. mymodel:1 (push it to your registry afterwards).",
)
@click.option(
    "--allow-secrets",
    is_flag=True,
    help="Bake -e / --env-file variables whose names look like secrets (TOKEN, SECRET, "
    "PASSWORD, KEY) into the image anyway.",
)
@click.option(
    "-q", "--quiet", is_flag=True, help="Print only errors and the final line, no build output."
)
def build(**params: Any) -> None:
    """Build a production image of the model in the current folder.

    \b
    abeja model build -h main:handler -t mymodel:1
    docker run --read-only --tmpfs /tmp -p 5000:5000 -p 5001:5001 mymodel:1

    The base image is -i, else ABEJA_IMAGE (in the environment, else in ./.env), else
    python:3.11-slim.
    """
    console = Console(quiet=params["quiet"], verbose=params["verbose"])
    reported(console, lambda: _build(params, console))


def _build(params: dict[str, Any], console: Console) -> int:
    options = ModelOptions.from_params(params)
    secrets = secret_names(list(options.env))
    if secrets and not params["allow_secrets"]:
        raise InputError(
            f"{', '.join(secrets)} would be baked into the image, where anyone who has it can "
            "read it (docker inspect); give it when the container runs instead (docker run -e "
            f"{secrets[0]}, or a Kubernetes Secret: abeja model manifests --secret NAME), or "
            "add --allow-secrets if it is no secret"
        )
    tag = check_image_tag(params["tag"].strip())
    from abeja_cli.docker_build import ImageBuilder
    from abeja_cli.docker_engine import DockerEngine

    engine = DockerEngine.connect(console)
    assert engine.source is not None
    origin = options.image_origin
    console.info(f"preparing image : {options.image}" + (f" (from {origin})" if origin else ""))
    builder = ImageBuilder(
        engine.client,
        engine.source,
        info=console.info,
        log=console.detail,
        warn=console.warning,
        without_docker="try the model without Docker meanwhile with abeja model run-local "
        "--engine local (build itself needs Docker)",
    )
    image = builder.production_image(
        options.project,
        options.image,
        tag=tag,
        env=options.env,
        no_cache=options.no_cache,
        origin=origin,
    )
    size = int(image.attrs.get("Size", 0))
    console.notice(f"built {tag} ({size / 1e6:.0f} MB, {str(image.id)[7:19]})")
    ports = f"-p {Config.port}:{Config.port} -p {Config.healthcheck_port}:{Config.healthcheck_port}"
    console.notice(f"run it with: docker run --read-only --tmpfs /tmp {ports} {tag}")
    return 0
