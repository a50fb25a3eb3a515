"""The Docker engine: the model runs in a container of its project's image.

The container publishes the runtime's port on 127.0.0.1 only, mounts the project at
``/srv/app`` (edits are live), runs as the calling user where that is not root, and is removed
on every way out of :meth:`DockerEngine.serve`: success, error, failed start, Ctrl+C.
"""

from __future__ import annotations

import gc
import os
import secrets
import socket
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Final

from abeja_cli.console import Console
from abeja_cli.docker_build import ImageBuilder
from abeja_cli.engine import SERVICE_PORT, BatchSpec, RunSpec, Server
from abeja_cli.errors import EngineUnavailable, ServerError
from abeja_cli.images import LABEL_PREFIX, RuntimeSource, find_runtime_source
from abeja_cli.server_log import LogSink, pump_lines, start_daemon

if TYPE_CHECKING:
    import docker
    from docker.models.containers import Container
    from docker.models.images import Image
    from docker.types import Mount

__all__ = ["DockerEngine", "DockerServer", "connect_docker", "docker_host"]

#: Seconds a stopping container gets to finish in-flight requests before it is killed.
_GRACE: Final = 10
_PROJECT_MOUNT: Final = "/srv/app"
#: A server's command runs under this, its stderr going where its stdout goes: Docker reads the
#: two apart, so a line written on stderr (a library's warning, a subprocess's output) came out
#: of order with the runtime's log on stdout. Every project image has /bin/sh: its Dockerfile
#: runs shell commands.
_ONE_OUTPUT: Final = ["/bin/sh", "-c", 'exec "$@" 2>&1', "sh"]
_BATCH_INPUTS: Final = "/srv/batch/in"
_BATCH_OUTPUT: Final = "/srv/batch/out"
#: Folders of a project image that a batch's input or output must not be mounted over.
_IMAGE_PATHS: Final = tuple(
    Path(f"/{name}")
    for name in ("srv", "usr", "bin", "sbin", "lib", "lib64", "etc", "proc", "sys", "dev")
) + tuple(Path(f"/{name}") for name in ("boot", "run", "var", "opt", "mnt"))


def docker_host() -> str:
    """Where the Docker SDK looks for the engine (for messages)."""
    return os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


def _device_options(spec: RunSpec) -> dict[str, Any]:
    """Container options per ``-d`` and ``--gpus``: GPUs through a device request, as
    ``docker run --gpus`` sends it; ``--gpus`` wins over the all of ``-d x86_gpu``."""
    from docker.types import DeviceRequest

    options = _device_type_options(spec.device_type)
    if spec.gpus is not None:
        count, ids = spec.gpus.count, list(spec.gpus.device_ids)
        request = DeviceRequest(count=count, device_ids=ids, capabilities=[["gpu"]])
        options["device_requests"] = [request]
    return options


def _device_type_options(device_type: str) -> dict[str, Any]:
    from docker.types import DeviceRequest

    if device_type == "x86_gpu":
        return {"device_requests": [DeviceRequest(count=-1, capabilities=[["gpu"]])]}
    if device_type == "jetson_tx2":  # abeja-sdk's settings for NVIDIA Jetson boards
        tegra = "/usr/lib/aarch64-linux-gnu/tegra"
        return {"privileged": True, "volumes": {tegra: {"bind": tegra, "mode": "ro"}}}
    if device_type == "raspberry3":
        return {"volumes": {"/opt": {"bind": "/opt", "mode": "ro"}}}
    return {}


class DockerServer(Server):
    """A running container of the project image."""

    def __init__(self, container: Container, port: int, sink: LogSink, image: str) -> None:
        self.container = container
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.description = f"docker container {container.short_id} of {image}"
        self._sink = sink

    def follow_logs(self) -> None:
        """Feed the container's output to the sink from a daemon thread, until it stops."""
        from docker.errors import APIError

        def pump() -> None:
            try:
                stream = self.container.logs(stream=True, follow=True)
                pump_lines(stream, self._sink)
            except APIError:
                pass  # the container was removed while we were reading: nothing more to show

        self.log_thread = start_daemon(pump, "container-log")

    def exit_code(self) -> int | None:
        from docker.errors import NotFound

        try:
            self.container.reload()
        except NotFound:
            return -1
        state = self.container.attrs.get("State", {})
        if state.get("Status") in ("exited", "dead"):
            return int(state.get("ExitCode", -1))
        return None

    def stop(self) -> None:
        from docker.errors import APIError

        with suppress(APIError):  # already gone; removal follows anyway
            self.container.stop(timeout=_GRACE)

    def reload(self) -> None:
        from docker.errors import APIError

        with suppress(APIError):  # it exited: the CLI says so next
            self.container.kill(signal="SIGHUP")


class DockerEngine:
    """Builds the project image and runs it, through the ``docker`` SDK."""

    name = "docker"

    def __init__(self, client: docker.DockerClient, console: Console) -> None:
        self.client = client
        self._console = console
        self._image: Image | None = None
        self.source: RuntimeSource | None = None

    @classmethod
    def connect(cls, console: Console) -> DockerEngine:
        """Connect and ping; :class:`EngineUnavailable` with a one-line reason otherwise."""
        client = connect_docker(timeout=30)
        engine = cls(client, console)
        try:
            engine.source = find_runtime_source()
        except EngineUnavailable:
            client.close()
            raise
        return engine

    def prepare(self, spec: RunSpec) -> None:
        if spec.inherit_env:
            self._console.warning(
                "--inherit-env applies to the local engine only; the container gets only the "
                "model's variables (-e, --env-file)"
            )
        origin = f" (from {spec.image_origin})" if spec.image_origin else ""
        self._console.info(f"preparing image : {spec.image}{origin}")
        self._console.info("building image")
        builder = ImageBuilder(
            self.client,
            self.source or find_runtime_source(),
            info=self._console.info,
            log=self._console.detail,
            warn=self._console.warning,
        )
        self._image = builder.project_image(
            spec.project, spec.image, no_cache=spec.no_cache, origin=spec.image_origin
        )

    @contextmanager
    def serve(self, spec: RunSpec, sink: LogSink) -> Iterator[Server]:
        from docker.errors import APIError, NotFound

        if self._image is None:
            self.prepare(spec)
        assert self._image is not None
        self._remove_orphans()
        # Named up front, so that a Ctrl+C landing while Docker creates it still finds it.
        name = f"abeja-local-{secrets.token_hex(6)}"
        try:
            container = self._create(spec, name)
            try:
                container.start()
            except APIError as exc:
                raise ServerError(_start_error(exc, spec)) from None
            container.reload()
            bindings = container.attrs["NetworkSettings"]["Ports"][f"{SERVICE_PORT}/tcp"]
            server = DockerServer(
                container, int(bindings[0]["HostPort"]), sink, self._image.tags[0]
            )
            server.follow_logs()
            yield server
            server.stop()  # gracefully: the model's last log lines (its access record) arrive
        finally:
            with suppress(NotFound):
                self.client.api.remove_container(name, force=True)

    def run_batch(self, spec: RunSpec, batch: BatchSpec, sink: LogSink, answer: BinaryIO) -> int:
        """``abeja-runtime batch`` in a container of the project image: each input mounted
        read-only, the output folder writable, each at its own path (see :func:`_mount_point`),
        so that what the runtime says of them (the failed inputs, where the answers are) names
        the user's files."""
        from docker.errors import APIError, NotFound
        from docker.types import Mount

        if self._image is None:
            self.prepare(spec)
        self._remove_orphans()
        mounts, inputs = [], []
        for number, path in enumerate(batch.inputs):
            inside = _mount_point(path, f"{_BATCH_INPUTS}/{number}/{path.name}")
            mounts.append(Mount(inside, str(path), type="bind", read_only=True))
            inputs.append(inside)
        output = None
        if batch.output is not None:
            output = _mount_point(batch.output, _BATCH_OUTPUT)
            mounts.append(Mount(output, str(batch.output), type="bind", read_only=False))
        command = ["abeja-runtime", *batch.arguments(inputs, output)]
        name = f"abeja-batch-{secrets.token_hex(6)}"
        try:
            container = self._create(spec, name, command=command, mounts=mounts)
            try:
                container.start()
            except APIError as exc:
                raise ServerError(_start_error(exc, spec)) from None

            def pump() -> None:
                with suppress(APIError):  # removed while we read: nothing more to show
                    stream = container.logs(stream=True, follow=True, stdout=False, stderr=True)
                    pump_lines(stream, sink)

            log = start_daemon(pump, "batch-log")
            code = int(container.wait()["StatusCode"])
            log.join(_GRACE)
            answer.write(container.logs(stdout=True, stderr=False))
            return code
        finally:
            with suppress(NotFound):
                self.client.api.remove_container(name, force=True)

    def _remove_orphans(self) -> None:
        remove_orphans(self.client, self._console)

    def _create(
        self,
        spec: RunSpec,
        name: str,
        *,
        command: list[str] | None = None,
        mounts: Sequence[Mount] = (),
    ) -> Container:
        """The container of a server (``command`` None: the image's, with its stderr on its
        stdout and the service port published) or of a one-shot ``command`` (no port)."""
        from docker.types import Mount

        assert self._image is not None
        server = command is None
        entrypoint = None
        if server:
            image_config = self._image.attrs["Config"]
            entrypoint = _ONE_OUTPUT
            command = [*(image_config.get("Entrypoint") or []), *(image_config.get("Cmd") or [])]
        env = dict(spec.env)
        options = _device_options(spec)
        # A Mount, not a volumes entry: a project path with ':' in it stays one path.
        project = Mount(_PROJECT_MOUNT, str(spec.project), type="bind", read_only=False)
        user = None
        if hasattr(os, "getuid") and os.getuid() != 0:
            # Files the model writes into the mounted project belong to the user, not root.
            user = f"{os.getuid()}:{os.getgid()}"
            env.setdefault("HOME", "/tmp")
        labels = {
            f"{LABEL_PREFIX}.kind": "container",
            f"{LABEL_PREFIX}.project": str(spec.project),
            # Who started it: a later run removes it if that CLI is gone (killed, SIGKILL).
            f"{LABEL_PREFIX}.cli-host": socket.gethostname(),
            f"{LABEL_PREFIX}.cli-pid": str(os.getpid()),
            **spec.labels,
        }
        host = ("127.0.0.1", spec.host_port) if spec.host_port else ("127.0.0.1",)
        return self.client.containers.create(
            str(self._image.id),
            entrypoint=entrypoint,
            command=command,
            name=name,
            detach=True,
            environment=env,
            working_dir=_PROJECT_MOUNT,
            ports={f"{SERVICE_PORT}/tcp": host} if server else None,
            mounts=[project, *mounts],
            labels=labels,
            user=user,
            **options,
        )


def _mount_point(path: Path, elsewhere: str) -> str:
    """Where a host path is mounted in a container: at the same path, unless that would cover
    a part of the image (the system's folders, the project at /srv/app); then ``elsewhere``."""
    if path.is_absolute() and not any(path.is_relative_to(taken) for taken in _IMAGE_PATHS):
        return str(path)
    return elsewhere


def remove_orphans(client: docker.DockerClient, console: Console) -> None:
    """Remove containers of ours whose CLI, on this machine, was killed before it could."""
    from docker.errors import APIError

    host = socket.gethostname()
    filters = {"label": [f"{LABEL_PREFIX}.kind=container", f"{LABEL_PREFIX}.cli-host={host}"]}
    # The low-level listing: the high-level one inspects each container again, and fails on
    # one that another command (another terminal) removed in between.
    for container in client.api.containers(all=True, filters=filters):
        pid = (container.get("Labels") or {}).get(f"{LABEL_PREFIX}.cli-pid", "")
        if not pid.isdigit() or _process_exists(int(pid)):
            continue
        with suppress(APIError):
            client.api.remove_container(container["Id"], force=True)
            name = container["Names"][0].lstrip("/")
            console.info(f"removed container {name}, left by an earlier run that was killed")


def remove_orphans_if_reachable(console: Console) -> None:
    """:func:`remove_orphans`, where Docker answers at once; nothing otherwise."""
    try:
        client = connect_docker(timeout=5)
    except EngineUnavailable:
        return
    try:
        remove_orphans(client, console)
    finally:
        client.close()


def connect_docker(timeout: float) -> docker.DockerClient:
    """A client of the engine at ``docker_host()`` that answered a ping.

    Raises :class:`EngineUnavailable` otherwise. docker-py leaves the socket of a failed
    attempt (its API version probe) to the garbage collector, which would report it as a
    ResourceWarning at some later point; it is collected here, quietly, instead.
    """
    import docker
    from docker.errors import DockerException

    client = None
    reason = ""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            client = docker.from_env(timeout=int(timeout))
            client.ping()
        except DockerException as exc:
            reason = _short(exc)
        if reason:
            if client is not None:
                client.close()
            gc.collect()
    if reason:
        raise EngineUnavailable(
            f"Docker is not reachable at {docker_host()} ({reason})",
            hint="start Docker, or use --engine local to run without it",
        )
    assert client is not None
    return client


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    return True


def _short(exc: BaseException) -> str:
    text = str(getattr(exc, "explanation", None) or exc)
    for marker in ("No such file or directory", "Connection refused", "Permission denied"):
        if marker in text:
            return marker.lower()
    return text.splitlines()[0][:160] if text else type(exc).__name__


def _start_error(exc: BaseException, spec: RunSpec) -> str:
    text = _short(exc)
    lowered = text.lower()
    asked = spec.gpus is not None or spec.device_type == "x86_gpu"
    if asked and ("gpu" in lowered or "device driver" in lowered):
        what, instead = (
            (f"the GPUs of --gpus {spec.gpus.text}", "without --gpus")
            if spec.gpus is not None
            else ("a GPU (-d x86_gpu)", "with -d x86_cpu")
        )
        return (
            f"Docker cannot give the container {what} ({text}): this machine needs an NVIDIA "
            f"GPU and the NVIDIA Container Toolkit (install it, then restart Docker); or run "
            f"{instead}"
        )
    if "port is already allocated" in lowered or "address already in use" in lowered:
        return f"port {spec.host_port} on 127.0.0.1 is already in use; choose another with -p"
    return f"Docker could not start the container: {text}"
