"""Building (or reusing) a project's image with the Docker SDK.

Build output is streamed to the console as it comes; a failing step raises
:class:`~abeja_cli.errors.BuildError` carrying the whole log, so the user sees pip's error
rather than abeja-sdk's silent fallback to a stale image.
"""

from __future__ import annotations

import contextlib
import fcntl
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import IO, TYPE_CHECKING, Any, Final

from abeja_cli import images
from abeja_cli.errors import BuildError
from abeja_cli.images import LABEL_PREFIX, ProjectKey, RuntimeKey, RuntimeSource
from abeja_cli.progress import Phases

if TYPE_CHECKING:
    from pathlib import Path

    import docker
    from docker.models.images import Image

__all__ = ["ImageBuilder"]

#: The classic builder's line naming the image a step produced (`` ---> 1a2b3c4d5e6f``).
_LAYER_RE: Final = re.compile(r"^ ---> ([0-9a-f]{12,64})$")
_INSTALLED_REQUIREMENTS: Final = (
    "installed the project's requirements",
    "installing the project's requirements",
)
_ADDED_PROJECT: Final = ("added the project", "adding the project")
#: The classic builder's step header (``Step 3/5 : RUN ...``).
_STEP_RE: Final = re.compile(r"^Step \d+/\d+ : (\S+) ?(.*)$")
#: A project whose files in the image add up to more than this gets a warning naming the
#: largest: a data set or a video left in the folder is copied into every image, silently.
LARGE_CONTEXT: Final = 50 * 1000 * 1000
#: How many of the largest files the warning names.
_LARGEST_NAMED: Final = 3


class ImageBuilder:
    """Finds or builds the runtime image and a project's image.

    ``info`` gets progress lines, ``warn`` what works but may not be what the user wants,
    ``log`` the build's whole output; ``without_docker`` is what the command's user can do
    without Docker, said when the base image is missing.
    """

    def __init__(
        self,
        client: docker.DockerClient,
        source: RuntimeSource,
        *,
        info: Callable[[str], None],
        log: Callable[[str], None],
        warn: Callable[[str], None] | None = None,
        without_docker: str = "run the model without Docker with --engine local",
    ) -> None:
        self._client = client
        self._source = source
        self._info = info
        self._warn = warn or info
        self._log = log
        self._without_docker = without_docker
        self._phases = Phases(info)

    # -- base image ----------------------------------------------------------------------

    def base_image_id(self, base_image: str, origin: str = "") -> str:
        """Id of the base image; pulled (saying so) only when it is not present locally.

        ``origin`` names the variable that chose it (``ABEJA_IMAGE in /path/.env``), for the
        error.
        """
        from docker.errors import APIError, ImageNotFound
        from docker.utils import parse_repository_tag

        try:
            return str(self._client.images.get(base_image).id)
        except ImageNotFound:
            pass
        repository, tag = parse_repository_tag(base_image)
        self._info(f"base image {base_image} is not present locally; pulling it")
        self._phases.start(f"pulled the base image {base_image}", f"pulling {base_image}")
        try:
            pulled = str(self._client.images.pull(repository, tag=tag or "latest").id)
            self._phases.end()
            return pulled
        except APIError as exc:
            self._phases.abandon()
            named = f" (from {origin})" if origin else ""
            raise BuildError(
                f"base image {base_image}{named} is not present locally and could not be pulled "
                f"({_explain(exc)}); choose an image you have (docker images lists them) with "
                f"-i, or once for every command with ABEJA_IMAGE (in the environment or the "
                f"project's .env), or {self._without_docker}"
            ) from None

    # -- the two images ------------------------------------------------------------------

    def runtime_image(
        self, base_image: str, *, no_cache: bool = False, origin: str = ""
    ) -> tuple[Image, RuntimeKey]:
        """The base image with abeja-runtime installed, shared by all projects."""
        key = RuntimeKey(
            base_image=base_image,
            base_image_id=self.base_image_id(base_image, origin),
            runtime_version=self._source.version,
            recipe=images.recipe_digest(self._source.runtime_dockerfile),
        )
        with self._building(key.digest):
            found = None if no_cache else self._find(key.digest, "runtime", key.tag)
            if found is not None:
                return found, key
            self._phases.start("runtime wheels ready", "building the runtime's wheels")
            wheels = images.runtime_wheels(self._source, self._log)
            self._phases.start("built the runtime image", "building the runtime image")
            self._info(
                f"building the runtime image {key.tag} (abeja-runtime {key.runtime_version})"
            )
            with images.runtime_context(self._source, wheels, key.labels()) as context:
                image = self._build(
                    context,
                    tag=key.tag,
                    buildargs={"BASE_IMAGE": key.base_image_id},
                    no_cache=no_cache,
                    what=f"the runtime image on {base_image}",
                )
        # Older runtime images on this base go; those still under a project image stay.
        self._remove_others(f"{LABEL_PREFIX}.base-image={base_image}", "runtime", keep=image)
        return image, key

    def project_image(
        self, project: Path, base_image: str, *, no_cache: bool = False, origin: str = ""
    ) -> Image:
        """The image run-local runs ``project`` in: reused while its cache key matches, else
        built. Its copy of the project may be older than the folder: run-local mounts the folder
        over it, so code edits need no rebuild."""
        return self._project_image(
            project, base_image, no_cache=no_cache, origin=origin, holding_current_files=False
        )

    def _project_image(
        self,
        project: Path,
        base_image: str,
        *,
        no_cache: bool,
        origin: str,
        holding_current_files: bool,
    ) -> Image:
        """The image for ``project``: reused while its cache key matches (and, with
        ``holding_current_files``, while it holds the project's files as they are now), else
        built. When only the files changed, Docker's layer cache keeps the installed
        requirements and the build copies the project again."""
        runtime, runtime_key = self.runtime_image(base_image, no_cache=no_cache, origin=origin)
        key = ProjectKey(
            runtime=runtime_key,
            project=project,
            requirements=images.requirements_digest(project),
            recipe=images.recipe_digest(self._source.project_dockerfile),
        )
        with self._building(key.digest):
            image, why = (None, "") if no_cache else self._cached(key, holding_current_files)
            if image is not None:
                return image
            self._info(f"building the image {key.tag} for {project}{why}")
            self._warn_of_large_files(project)
            requirements = key.requirements != "none"
            self._phases.start(*(_INSTALLED_REQUIREMENTS if requirements else _ADDED_PROJECT))
            with images.project_context(self._source, project, key.labels()) as context:
                image = self._build(
                    context,
                    tag=key.tag,
                    buildargs={"RUNTIME_IMAGE": str(runtime.id)},
                    no_cache=no_cache,
                    what=f"the image of {project}",
                )
        # This project's other images (other requirements, older runtime, older files) are
        # stale now.
        self._remove_others(f"{LABEL_PREFIX}.project={key.project}", "project", keep=image)
        return image

    def _cached(self, key: ProjectKey, holding_current_files: bool) -> tuple[Image | None, str]:
        """The cached project image that will do, saying so; else ``None`` and why the cached
        one will not (empty when there is none)."""
        if not holding_current_files:
            found = self._find(key.digest, "project", key.tag)
            if found is not None:
                self._info(
                    f"using the cached image {key.tag}; the project folder is mounted over its "
                    "copy of the project, so edits need no rebuild (pass --no-cache to rebuild it)"
                )
            return found, ""
        files = images.project_files_digest(key.project)
        found = self._find(key.digest, "project", key.tag, files=files)
        if found is not None:
            self._info(
                f"using the cached image {key.tag}: it holds the project's files as they are now "
                "(pass --no-cache to rebuild it)"
            )
            return found, ""
        if self._find(key.digest, "project", key.tag) is None:
            return None, ""
        return None, ": the project's files changed since the cached image was built"

    def production_image(
        self,
        project: Path,
        base_image: str,
        *,
        tag: str,
        env: Mapping[str, str],
        no_cache: bool = False,
        origin: str = "",
    ) -> Image:
        """The project image made production-ready (images/production.Dockerfile), as ``tag``,
        on a project image that holds the project's files as they are now.

        ``env`` holds HANDLER and the model's variables; they are baked in as ``ENV``.
        """
        # No mount here: the image must hold the project's files as they are now.
        base = self._project_image(
            project, base_image, no_cache=no_cache, origin=origin, holding_current_files=True
        )
        labels = {
            f"{LABEL_PREFIX}.kind": "production",
            # The folder's name, not its path: the image is shipped, the builder's home is not.
            f"{LABEL_PREFIX}.project": project.name,
            f"{LABEL_PREFIX}.runtime-version": self._source.version,
            f"{LABEL_PREFIX}.handler": env.get("HANDLER", ""),
        }
        # Our production image that the tag names before this build, if it names one.
        named = self._named(tag)
        kind = named.labels.get(f"{LABEL_PREFIX}.kind") if named is not None else None
        replaced = str(named.id) if named is not None and kind == "production" else None
        self._info(f"building the production image {tag}")
        self._phases.start(f"built the production image {tag}", f"building {tag}")
        with images.production_context(self._source, env, labels) as context:
            image = self._build(
                context,
                tag=tag,
                buildargs={"PROJECT_IMAGE": str(base.id)},
                no_cache=no_cache,
                what=f"the production image {tag}",
            )
        if replaced is not None and replaced != image.id and self._remove_replaced(replaced, tag):
            # The project image it was built on (an older copy of the project) can go now too.
            self._remove_others(f"{LABEL_PREFIX}.project={project}", "project", keep=base)
        return image

    # -- helpers -------------------------------------------------------------------------

    @contextlib.contextmanager
    def _building(self, digest: str) -> Iterator[None]:
        """One build of an image at a time on this machine: a second command that wants the
        same image (two terminals, parallel tests) waits, then finds it built, instead of
        building it again and leaving the first one untagged (dangling)."""
        locks = images.cache_dir() / "locks"
        locks.mkdir(parents=True, exist_ok=True)
        with open(locks / f"{digest}.lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self._info("waiting for another abeja command that builds the same image")
                fcntl.flock(lock, fcntl.LOCK_EX)
            yield  # the lock goes with the file

    def _warn_of_large_files(self, project: Path) -> None:
        """Say so when the project's files that go into the image are large (a data set, a
        video left in the folder), naming the largest and ``.dockerignore``."""
        total, largest = images.largest_files(project, _LARGEST_NAMED)
        if total <= LARGE_CONTEXT:
            return
        # Files of a megabyte or more: a list of 0 MB files would hide the point.
        shown = [(path, size) for path, size in largest if size >= 1e6] or largest[:1]
        named = ", ".join(
            f"{path.relative_to(project).as_posix()} ({_megabytes(size)})" for path, size in shown
        )
        self._warn(
            f"{_megabytes(total)} of the project's files are copied into the image; the "
            f"largest: {named}. List the ones the model does not need in "
            f"{project / '.dockerignore'} (a path or pattern a line) to leave them out"
        )

    def _named(self, tag: str) -> Image | None:
        """The image ``tag`` names, if it names one."""
        from docker.errors import ImageNotFound

        try:
            return self._client.images.get(tag)
        except ImageNotFound:
            return None

    def _find(self, digest: str, kind: str, tag: str, *, files: str = "") -> Image | None:
        """Our image of ``kind`` named ``tag``, if it has that cache key and, given ``files``,
        that :data:`~abeja_cli.images.FILES_LABEL`. An image that lost the name (an older copy
        of the project) is not looked for: when the files are back to what it holds, building
        again reuses its layers from Docker's cache."""
        image = self._named(tag)
        if image is None:
            return None
        wanted = {f"{LABEL_PREFIX}.cache-key": digest, f"{LABEL_PREFIX}.kind": kind}
        if files:
            wanted[images.FILES_LABEL] = files
        labels = image.labels
        return image if all(labels.get(name) == value for name, value in wanted.items()) else None

    def _remove_replaced(self, replaced: str, tag: str) -> bool:
        """Remove the production image ``tag`` named before this build, saying so, unless
        another name or a container still has it (each edit of the project makes a new one,
        with its own copy of the project). Whether it was removed."""
        from docker.errors import APIError

        try:
            if self._client.images.get(replaced).tags:
                return False
            self._client.images.remove(replaced, noprune=False)
        except APIError:  # a container uses it, or it was removed meanwhile
            return False
        self._info(
            f"removed the image {tag} named before this build ({replaced[7:19]}): nothing else "
            "named or used it"
        )
        return True

    # Listings go through the low-level API: the high-level one inspects each image again, and
    # fails on one that another command (another terminal, a parallel test) removed meanwhile.

    def _remove_others(self, label: str, kind: str, *, keep: Image) -> None:
        """Remove our images with ``label`` of this kind except ``keep``, if nothing uses them."""
        from docker.errors import APIError

        filters = {"label": [label, f"{LABEL_PREFIX}.kind={kind}"]}
        for image in self._client.api.images(filters=filters, quiet=True):
            if image != keep.id:
                # Used by a container or a child image: docker refuses, and it stays.
                with contextlib.suppress(APIError):
                    self._client.images.remove(image, noprune=False)

    def _remove_failed_layers(self, layers: list[str]) -> None:
        """Drop the untagged layers a failed build left behind (never a tagged image)."""
        from docker.errors import APIError

        for layer in reversed(layers):
            with contextlib.suppress(APIError):
                if not self._client.images.get(layer).tags:
                    self._client.images.remove(layer, noprune=False)

    def _dockerfile_step(self, instruction: str, argument: str) -> None:
        """A Dockerfile step began: copying the project ends the requirements' phase."""
        copying = instruction == "COPY" and argument.startswith("project/")
        if copying and self._phases.current != _ADDED_PROJECT[0]:
            self._phases.start(*_ADDED_PROJECT)

    def _build(
        self,
        context: IO[bytes],
        *,
        tag: str,
        buildargs: Mapping[str, str],
        no_cache: bool,
        what: str,
    ) -> Image:
        from docker.errors import APIError

        log: list[str] = []
        layers: list[str] = []
        try:
            stream: Iterable[dict[str, Any]] = self._client.api.build(
                fileobj=context,
                custom_context=True,
                tag=tag,
                buildargs=dict(buildargs),
                nocache=no_cache,
                rm=True,
                forcerm=True,  # no intermediate container is left behind by a failed step
                pull=False,
                decode=True,
            )
            image_id = self._consume(stream, log, layers)
        except APIError as exc:
            self._phases.abandon()
            self._remove_failed_layers(layers)
            raise BuildError(f"building {what} failed: {_explain(exc)}", log="".join(log)) from None
        if isinstance(image_id, BuildError):
            self._phases.abandon()
            self._remove_failed_layers(layers)
            image_id.log = "".join(log)
            raise image_id
        self._phases.end()
        return self._client.images.get(image_id or tag)

    def _consume(
        self, stream: Iterable[dict[str, Any]], log: list[str], layers: list[str]
    ) -> str | BuildError:
        image_id = ""
        pending = ""
        for chunk in stream:
            if "stream" in chunk:
                pending += str(chunk["stream"])
                *lines, pending = pending.split("\n")
                for line in lines:
                    self._output_line(line, log, layers)
            elif "error" in chunk:
                if pending:
                    log.append(pending + "\n")
                    self._log(pending)
                message = str(chunk.get("errorDetail", {}).get("message") or chunk["error"])
                log.append(message + "\n")
                return _build_failed(message)
            elif "aux" in chunk and isinstance(chunk["aux"], dict):
                image_id = str(chunk["aux"].get("ID", image_id))
            elif "status" in chunk:  # pull progress of a FROM image
                self._log(str(chunk["status"]))
        if pending:
            log.append(pending)
            self._log(pending)
        return image_id

    def _output_line(self, line: str, log: list[str], layers: list[str]) -> None:
        """A line of the build's output: logged, shown as progress, its step and layer noted."""
        log.append(line + "\n")
        self._log(line)
        self._phases.output(line)
        step = _STEP_RE.match(line)
        if step:
            self._dockerfile_step(step.group(1).upper(), step.group(2))
        layer = _LAYER_RE.match(line)
        if layer:
            layers.append(layer.group(1))


def _build_failed(message: str) -> BuildError:
    """The error for the engine's ``message``, said for what users can do about it."""
    if "requirements.txt" in message:
        return BuildError(
            "pip could not install the project's requirements.txt (see its error in the build "
            "log); fix the file and run again"
        )
    return BuildError(f"building the image failed: {_first_line(message)} (see the build log)")


def _megabytes(size: int) -> str:
    return f"{size / 1e6:.0f} MB"


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


def _explain(exc: Exception) -> str:
    explanation = getattr(exc, "explanation", None)
    return _first_line(str(explanation or exc))
