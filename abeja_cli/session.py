"""The part both commands share: validated options → engine → ready server.

Order matters and is the point of this module: everything the user typed is validated first
(no image is built and no container started for a typo), then the engine is chosen, the image
built, and the server started and awaited.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final, NoReturn

import click

from abeja_cli.base_image import DEFAULT_IMAGE, DOTENV, IMAGE_VARIABLE, default_image, image_origin
from abeja_cli.console import Console
from abeja_cli.engine import Engine, RunSpec, Server
from abeja_cli.environment import model_environment, without_drain_delay
from abeja_cli.errors import CliError, EngineUnavailable, InputError
from abeja_cli.gpus import GpuRequest, GpuRequestType
from abeja_cli.readiness import wait_ready
from abeja_cli.server_log import LogSink
from abeja_runtime.options import passing_option, setting_named, variable_text

__all__ = [
    "DEVICE_TYPES",
    "PASSED_SETTINGS",
    "STOP_SIGNALS",
    "ModelCommand",
    "ModelOptions",
    "check_handler_file",
    "model_options",
    "prepare_engine",
    "reported",
    "select_engine",
    "start_server",
    "terminate_as_interrupt",
]

DEVICE_TYPES: Final = ("x86_cpu", "x86_gpu", "jetson_tx2", "raspberry3")
#: The runtime's settings that the model commands take as options of their own and pass on
#: as the runtime's variables (a command that names its options takes those it names).
PASSED_SETTINGS: Final = (
    "timeout",
    "max_body_size",
    "max_batch_size",
    "max_batch_wait",
    "cancel_raises",
)


@dataclass(frozen=True)
class ModelOptions:
    """The options both commands take, after validation."""

    handler: str
    image: str
    device_type: str
    env: dict[str, str]
    engine: str | None
    no_cache: bool
    startup_timeout: float
    project: Path
    inherit_env: bool = False
    #: -i was given on the command line (the local engine says that it does not use it).
    image_given: bool = False
    #: The variable that chose the base image (ABEJA_IMAGE, or that of .env; "" for -i and
    #: the default), named in messages about the image.
    image_origin: str = ""
    gpus: GpuRequest | None = None

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> ModelOptions:
        """Validate the shared options; raises :class:`InputError` with one line."""
        handler = params["handler"].strip()
        module, sep, function = handler.partition(":")
        if not sep or not module or not function or ":" in function:
            raise InputError(f"-h {handler!r} is not MODULE:FUNCTION; write it like main:handler")
        project = Path.cwd().resolve()
        check_handler_file(handler, project)
        _check_organization_id(params["organization_id"])
        env_file = params["env_file"]
        env = model_environment(
            handler=handler,
            env_options=params["environment"],
            env_file=Path(env_file) if env_file is not None else None,
            organization_id=params["organization_id"],
        )
        # The runtime settings a user meets first, as options; -e still works for every other.
        for name in PASSED_SETTINGS:
            if params.get(name) is not None:
                env[str(setting_named(name).envvar)] = variable_text(params[name])
        if params["v1"]:
            # abeja-sdk's --v1 ran the 18.10 runtime; ours serves that handler style itself.
            env.setdefault(str(setting_named("style").envvar), "abeja-v1")
        image = params["image"].strip()
        if image.startswith("abeja-inc/"):  # abeja-sdk's rewrite of its own images' names
            image = "abeja/" + image.removeprefix("abeja-inc/")
        return cls(
            handler=handler,
            image=image,
            device_type=params.get("device_type", "x86_cpu"),
            gpus=params.get("gpus"),
            env=env,
            engine=params.get("engine"),
            no_cache=params["no_cache"],
            startup_timeout=params.get("startup_timeout", 120.0),
            inherit_env=params.get("inherit_env", False),
            image_given=_source("image") is click.core.ParameterSource.COMMANDLINE,
            image_origin=image_origin(_source("image"), project),
            project=project,
        )

    def spec(self, *, host_port: int | None = None) -> RunSpec:
        return RunSpec(
            project=self.project,
            handler=self.handler,
            env=self.env,
            image=self.image,
            device_type=self.device_type,
            gpus=self.gpus,
            host_port=host_port,
            no_cache=self.no_cache,
            inherit_env=self.inherit_env,
            image_origin=self.image_origin,
        )


def check_handler_file(handler: str, project: Path) -> None:
    """The module that HANDLER names must be in the project (or importable here: a package
    installed in this Python), or the model could never start; the runtime's own words for
    that case speak of ABEJA Platform's zip/tar packaging, which is no help here."""
    module = handler.partition(":")[0]
    relative = Path(*module.split("."))
    top = project / relative.parts[0]
    if top.with_suffix(".py").is_file() or top.is_dir():
        candidates = (project / relative.with_suffix(".py"), project / relative / "__init__.py")
        if len(relative.parts) == 1 or any(path.is_file() for path in candidates):
            return
    elif _importable(relative.parts[0]):
        return
    file = relative.with_suffix(".py")
    raise InputError(
        f"there is no {file} in {project} (-h {handler}); run the command in the folder of "
        "your handler, fix -h, or start a project with: abeja model init"
    )


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _check_organization_id(value: str | None) -> None:
    """``-o`` is ABEJA's organization id, in every model command; ``-o answer.jpg`` (meant as
    an output file) set the id to a file name and wrote nothing."""
    if value is not None and ("." in value or "/" in value):
        raise InputError(
            f"-o {value}: -o is the organization id, as on ABEJA's CLI, and this looks like a "
            f"file name; to write the answer to a file, use --output {value}"
        )


class ModelCommand(click.Command):
    """A model command: ``-h`` is the handler, as on ABEJA's CLI (elsewhere it is help), so
    ``-h`` alone gets a pointer to ``--help`` instead of click's bare "requires an argument"."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        settings = kwargs.setdefault("context_settings", {})
        settings.setdefault("help_option_names", ["--help"])
        super().__init__(*args, **kwargs)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.BadOptionUsage as exc:
            if exc.option_name not in ("-h", "--handler"):
                raise
            raise click.BadOptionUsage(
                exc.option_name,
                f"{exc.option_name} needs the handler, as MODULE:FUNCTION (e.g. -h main:handler); "
                "-h is not help here: for help use --help",
                ctx,
            ) from None


#: Every option of the model commands, by parameter name, in the order ``--help`` lists them.
_MODEL_OPTIONS: Final[dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]]] = {
    "handler": click.option(
        "-h",
        "--handler",
        required=True,
        metavar="MODULE:FUNCTION",
        help="Model handler, e.g. main:handler (becomes HANDLER).",
    ),
    "image": click.option(
        "-i",
        "--image",
        default=default_image,
        show_default=f"{IMAGE_VARIABLE} in ./{DOTENV}, else {DEFAULT_IMAGE}",
        envvar=IMAGE_VARIABLE,
        show_envvar=True,
        help="Base image with Python 3.11+ that the model's image is built on (Docker engine); "
        f"set it once with {IMAGE_VARIABLE}, in the environment or in the project's {DOTENV}.",
    ),
    "device_type": click.option(
        "-d",
        "--device-type",
        "--device_type",
        "device_type",
        type=click.Choice(DEVICE_TYPES),
        default="x86_cpu",
        show_default=True,
        help="Device type; x86_gpu gives the container all GPUs.",
    ),
    "gpus": click.option(
        "--gpus",
        type=GpuRequestType(),
        default=None,
        metavar="all | N | device=ID[,ID...]",
        help="GPUs for the model, as docker run --gpus takes them (wins over -d x86_gpu). "
        "Docker engine: asked of Docker, which needs NVIDIA's Container Toolkit; local engine: "
        "the model is shown them through CUDA_VISIBLE_DEVICES (a count: the first N).",
    ),
    "environment": click.option(
        "-e",
        "--environment",
        multiple=True,
        metavar="KEY=VALUE",
        help="Environment variable for the model (KEY=VALUE or KEY:VALUE); repeatable.",
    ),
    "env_file": click.option(
        "--env-file",
        type=click.Path(dir_okay=False),
        default=None,
        help="File of KEY=VALUE lines (dotenv syntax) for the model's environment.",
    ),
    "organization_id": click.option(
        "-o",
        "--organization-id",
        "--organization_id",
        "organization_id",
        default=None,
        help="Sets ABEJA_ORGANIZATION_ID (no account or network call is needed); "
        "the answer goes to a file with --output.",
    ),
    "no_cache": click.option(
        "--no-cache",
        "--no_cache",
        "no_cache",
        is_flag=True,
        help="Rebuild the image from scratch, without Docker's layer cache.",
    ),
    "v1": click.option(
        "--v1",
        is_flag=True,
        help="Serve an 18.10-style handler(iterable, context) generator "
        "(sets ABEJA_RUNTIME_STYLE=abeja-v1).",
    ),
    "engine": click.option(
        "--engine",
        type=click.Choice(["docker", "local"]),
        default=None,
        envvar="ABEJA_ENGINE",
        show_envvar=True,
        help="docker (default when Docker is reachable) or local (this Python, no Docker).",
    ),
    "inherit_env": click.option(
        "--inherit-env",
        is_flag=True,
        help="Local engine: give the model this shell's whole environment (by default only "
        "PATH, HOME, locale, TMPDIR, the Python environment and -e/--env-file reach it, as in "
        "a container).",
    ),
    # The runtime settings a user meets first, as the runtime declares them.
    **{name: passing_option(setting_named(name)) for name in PASSED_SETTINGS},
    "verbose": click.option(
        "-v",
        "--verbose",
        is_flag=True,
        help="Show the whole build output (pip's included), not one line per build phase.",
    ),
    "startup_timeout": click.option(
        "--startup-timeout",
        type=click.FloatRange(min=1),
        default=120.0,
        show_default=True,
        envvar="ABEJA_STARTUP_TIMEOUT",
        show_envvar=True,
        help="Seconds to wait for the model server to become ready.",
    ),
}


def model_options(*names: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a command with the named model options (all of them when none is named).

    run-local and run-local-server take them all; build takes those that shape an image.
    """
    chosen = [_MODEL_OPTIONS[name] for name in (names or tuple(_MODEL_OPTIONS))]

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(chosen):
            func = option(func)
        return func

    return decorate


def _source(name: str) -> click.core.ParameterSource | None:
    context = click.get_current_context(silent=True)
    return context.get_parameter_source(name) if context is not None else None


def select_engine(choice: str | None, console: Console) -> Engine:
    """The engine to use; Docker by default, the local one when Docker is not reachable."""
    from abeja_cli.local_engine import LocalEngine

    if choice == "local":
        return LocalEngine(console)
    from abeja_cli.docker_engine import DockerEngine

    try:
        return DockerEngine.connect(console)
    except EngineUnavailable as exc:
        if choice == "docker":
            raise
        console.info(
            f"{exc.reason}; running the model with the local engine instead (--engine local)"
        )
        return LocalEngine(console)


def prepare_engine(
    options: ModelOptions, console: Console, *, host_port: int | None = None
) -> tuple[Engine, RunSpec]:
    """Choose the engine and build (or check) what it needs for the project."""
    engine = select_engine(options.engine, console)
    if engine.name == "local" and options.image_given:
        console.warning(
            f"-i {options.image} is not used by the local engine: the model runs in this "
            f"Python ({sys.executable}); use --engine docker to run it on that image"
        )
    spec = options.spec(host_port=host_port)
    engine.prepare(spec)
    return engine, spec


@contextmanager
def start_server(
    options: ModelOptions,
    console: Console,
    sink: LogSink,
    *,
    host_port: int | None = None,
) -> Iterator[tuple[Engine, Server]]:
    """Choose the engine, build, start, wait until ready; stopped and removed on exit."""
    engine, spec = prepare_engine(options, console, host_port=host_port)
    inherited = os.environ if engine.name == "local" and spec.inherit_env else {}
    env = without_drain_delay(spec.env, project=spec.project, inherited=inherited)
    spec = replace(spec, env=env)
    console.info("setting up local server")
    with engine.serve(spec, sink) as server:
        console.info(f"waiting server running : {server.url}")
        wait_ready(server, timeout=options.startup_timeout, sink=sink)
        yield engine, server


#: Signals that end a command like Ctrl+C: SIGTERM (kill, a supervisor) and SIGHUP (the
#: terminal was closed), so that the model server is stopped and removed on each of them.
STOP_SIGNALS: Final = (signal.SIGTERM, signal.SIGHUP)


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Treat SIGTERM and SIGHUP like Ctrl+C, so ``with`` blocks clean up (remove the
    container, stop the local runtime) on all of them."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> NoReturn:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def reported(console: Console, body: Callable[[], int]) -> NoReturn:
    """Run a command's body and exit with its code. An error it raises goes on to click, which
    shows it on this console (:meth:`CliError.show`) and exits with its code; Ctrl-C is one
    line and 130, as a shell reports it."""
    try:
        code = body()
    except CliError as exc:
        exc.console = console
        raise
    except KeyboardInterrupt:
        console.error("interrupted; nothing was left running")
        code = 130
    sys.exit(code)
