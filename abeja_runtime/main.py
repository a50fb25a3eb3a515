"""The ``abeja-runtime`` command: flags and environment → :class:`Config` → ``run(config)``.

Every option has an environment variable (the names are fixed by the contract); click gives the
precedence command line > environment > default. ``.env`` in the start directory fills in
variables that are not set yet. A bad value is one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Any, Final

import click
from dotenv import load_dotenv

from abeja_runtime import __version__
from abeja_runtime.config import (
    DEFAULT_MAX_BODY_SIZE,
    DEFAULT_MAX_IMAGE_PIXELS,
    DEFAULT_MAX_PARTS,
    DEFAULT_SPOOL_THRESHOLD,
    LOG_LEVELS,
    LOOPS,
    STYLES,
    Config,
    PlatformIds,
    parse_bool,
    parse_context,
)

__all__ = ["batch", "cli", "kserve", "main"]

#: logrus level names used by ABEJA Platform, mapped onto ours.
_LEVEL_ALIASES: Final = {
    "trace": "debug",
    "warn": "warning",
    "fatal": "critical",
    "panic": "critical",
}


class ByteSize(click.ParamType):  # type: ignore[type-arg,unused-ignore]
    """A byte count: ``1048576``, ``512KiB``, ``100MiB``, ``1GiB`` (KB, MB, GB: also 1024-based)."""

    name = "bytes"
    _pattern: Final = re.compile(r"^\s*(\d+)\s*([kmg]i?b?)?\s*$", re.IGNORECASE)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        match = self._pattern.match(str(value))
        if not match:
            self.fail(f"{value!r} is not a size in bytes (e.g. 1048576 or 100MiB)", param, ctx)
        number, unit = match.groups()
        return int(number) * int(1024 ** (" kmg".index(unit[0].lower()) if unit else 0))


class LogLevel(click.Choice):  # type: ignore[type-arg,unused-ignore]
    def __init__(self) -> None:
        super().__init__([*LOG_LEVELS, *_LEVEL_ALIASES], case_sensitive=False)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        level = str(super().convert(value, param, ctx)).lower()
        return _LEVEL_ALIASES.get(level, level)


class JsonObject(click.ParamType):  # type: ignore[type-arg,unused-ignore]
    name = "json"

    def __init__(self, variable: str = "CONTEXT") -> None:
        self.variable = variable  # named in error messages

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, dict):
            return value
        try:
            return parse_context(value, self.variable)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


_PORT = click.IntRange(0, 65535)


@click.command(
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="\b\nOther commands (each with its own --help):\n"
    "  abeja-runtime batch [INPUTS]...   run the handler once per input, without a server\n"
    "  abeja-runtime kserve SCRIPT ...   serve a KServe model file unchanged",
)
@click.option(
    "--handler",
    envvar="HANDLER",
    show_envvar=True,
    default=Config.handler,
    show_default=True,
    help="The handler to serve, as module:function.",
)
@click.option(
    "--host",
    envvar="ABEJA_RUNTIME_HOST",
    show_envvar=True,
    default=Config.host,
    show_default=True,
    help="Interface to listen on (0.0.0.0: all; 127.0.0.1: this machine only).",
)
@click.option(
    "--port",
    envvar="PORT",
    show_envvar=True,
    type=_PORT,
    default=Config.port,
    show_default=True,
    help="Service port: the handler on any path, and /health_check.",
)
@click.option(
    "--healthcheck-port",
    envvar="HEALTHCHECK_PORT",
    show_envvar=True,
    type=_PORT,
    default=Config.healthcheck_port,
    show_default=True,
    help="Port that serves only /health_check.",
)
@click.option(
    "--workers",
    envvar="ABEJA_RUNTIME_WORKERS",
    show_envvar=True,
    type=click.IntRange(min=1),
    default=Config.workers,
    show_default=True,
    help="Worker processes, each with its own copy of the handler.",
)
@click.option(
    "--concurrency",
    envvar="ABEJA_RUNTIME_CONCURRENCY",
    show_envvar=True,
    type=click.IntRange(min=1),
    default=Config.concurrency,
    show_default=True,
    help="Handler calls that may run at once in one worker. Raise it only for "
    "thread-safe handlers.",
)
@click.option(
    "--max-queue",
    envvar="ABEJA_RUNTIME_MAX_QUEUE",
    show_envvar=True,
    type=click.IntRange(min=0),
    default=Config.max_queue,
    show_default=True,
    help="Requests that may wait for a handler slot in one worker; beyond that: 503 service busy.",
)
@click.option(
    "--timeout",
    envvar="ABEJA_RUNTIME_TIMEOUT",
    show_envvar=True,
    type=click.FloatRange(min=0),
    default=Config.timeout,
    show_default=True,
    help="Seconds a request may take until the handler answers (504 after); 0: none.",
)
@click.option(
    "--max-body-size",
    envvar="ABEJA_RUNTIME_MAX_BODY_SIZE",
    show_envvar=True,
    type=ByteSize(),
    default=DEFAULT_MAX_BODY_SIZE,
    show_default=True,
    help="Largest request body in bytes (413 above); 0: no limit.",
)
@click.option(
    "--spool-threshold",
    envvar="ABEJA_RUNTIME_SPOOL_THRESHOLD",
    show_envvar=True,
    type=ByteSize(),
    default=DEFAULT_SPOOL_THRESHOLD,
    show_default=True,
    help="Bodies larger than this many bytes are spooled to a temporary file.",
)
@click.option(
    "--max-parts",
    envvar="ABEJA_RUNTIME_MAX_PARTS",
    show_envvar=True,
    type=click.IntRange(min=0),
    default=DEFAULT_MAX_PARTS,
    show_default=True,
    help="Most parts a multipart/form-data body may have (413 above); 0: no limit.",
)
@click.option(
    "--max-image-pixels",
    envvar="ABEJA_RUNTIME_MAX_IMAGE_PIXELS",
    show_envvar=True,
    type=click.IntRange(min=0),
    default=DEFAULT_MAX_IMAGE_PIXELS,
    show_default=True,
    help="Most pixels of an image opened with Pillow on the handler side (413 above, checked "
    "before decoding); 0: no limit.",
)
@click.option(
    "--max-requests",
    envvar="ABEJA_RUNTIME_MAX_REQUESTS",
    show_envvar=True,
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Requests a worker serves before a fresh one replaces it (plus up to 10 %), without "
    "failing a request: for handlers that leak; 0: never.",
)
@click.option(
    "--max-worker-memory",
    envvar="ABEJA_RUNTIME_MAX_WORKER_MEMORY",
    show_envvar=True,
    type=ByteSize(),
    default=0,
    show_default=True,
    help="Resident memory above which a worker is replaced by a fresh one, without failing a "
    "request; 0: no limit.",
)
@click.option(
    "--grace-period",
    envvar="ABEJA_RUNTIME_GRACE_PERIOD",
    show_envvar=True,
    type=click.FloatRange(min=0),
    default=Config.grace_period,
    show_default=True,
    help="Seconds in-flight requests get at shutdown; a handler still running "
    "timeout + grace seconds after it started gets its worker recycled.",
)
@click.option(
    "--keepalive-timeout",
    envvar="ABEJA_RUNTIME_KEEPALIVE_TIMEOUT",
    show_envvar=True,
    type=click.FloatRange(min=0, min_open=True),
    default=Config.keepalive_timeout,
    show_default=True,
    help="Seconds an idle keep-alive connection stays open.",
)
@click.option(
    "--request-head-timeout",
    envvar="ABEJA_RUNTIME_REQUEST_HEAD_TIMEOUT",
    show_envvar=True,
    type=click.FloatRange(min=0, min_open=True),
    default=Config.request_head_timeout,
    show_default=True,
    help="Seconds a client has to send its request line and headers (408 after).",
)
@click.option(
    "--log-level",
    envvar="LOG_LEVEL",
    show_envvar=True,
    type=LogLevel(),
    default=Config.log_level,
    show_default=True,
    help="Lowest level of log records written.",
)
@click.option(
    "--user-model-root",
    envvar="ABEJA_USER_MODEL_ROOT",
    show_envvar=True,
    default="",
    help="Directory of the handler's code, relative to the current one.  "
    "[default: current directory]",
)
@click.option(
    "--training-result-dir",
    envvar="ABEJA_TRAINING_RESULT_DIR",
    show_envvar=True,
    default="",
    help="Directory of training results, made absolute and exported to the handler.  "
    "[default: abejainc_training_result]",
)
@click.option(
    "--context",
    envvar="CONTEXT",
    show_envvar=True,
    type=JsonObject(),
    default="{}",
    help="JSON object passed as the handler's context argument.  [default: {}]",
)
@click.option(
    "--install-requirements/--no-install-requirements",
    envvar="ABEJA_RUNTIME_INSTALL_REQUIREMENTS",
    show_envvar=True,
    default=False,
    show_default=True,
    help="Install requirements.txt (or Pipfile) at start-up, as ABEJA Platform does.",
)
@click.option(
    "--loop",
    envvar="ABEJA_RUNTIME_LOOP",
    show_envvar=True,
    type=click.Choice(LOOPS, case_sensitive=False),
    default=Config.loop,
    show_default=True,
    help="The event loop of the front and of async workers; auto picks uvloop when it is "
    "installed (pip install 'abeja-runtime[fast]').",
)
@click.option(
    "--style",
    envvar="ABEJA_RUNTIME_STYLE",
    show_envvar=True,
    type=click.Choice(STYLES, case_sensitive=False),
    default=Config.style,
    show_default=True,
    help="Handler style: abeja (handler(request, context)), abeja-v1 (18.10 generator "
    "handlers), cortex (pre_inference/post_inference + ONNX model), kserve (kserve.Model "
    "class), seldon (class with predict); auto detects it from what HANDLER names.",
)
@click.option(
    "--parameters",
    "seldon_parameters",
    envvar="PREDICTIVE_UNIT_PARAMETERS",
    show_envvar=True,
    default=Config.seldon_parameters,
    help="Seldon style: constructor parameters, a JSON list of "
    '{"name": ..., "value": "...", "type": "INT|FLOAT|DOUBLE|STRING|BOOL"}, as seldon-core takes '
    "them.",
)
@click.option(
    "--model-metadata",
    "seldon_metadata",
    envvar="MODEL_METADATA",
    show_envvar=True,
    default=Config.seldon_metadata,
    help="Seldon style: model metadata (YAML or JSON); init_metadata() wins where both set a key.",
)
@click.option(
    "--predictive-unit-id",
    "seldon_unit_id",
    envvar="PREDICTIVE_UNIT_ID",
    show_envvar=True,
    default=Config.seldon_unit_id,
    help="Seldon style: this unit's id in the inference graph; feedback passes the routing "
    "decision recorded under it to send_feedback.",
)
@click.option(
    "--predictive-unit-image",
    "seldon_unit_image",
    envvar="PREDICTIVE_UNIT_IMAGE",
    show_envvar=True,
    default=Config.seldon_unit_image,
    help="Seldon style: this unit's image, named with its id in meta.requestPath.",
)
@click.option(
    "--service-type",
    "seldon_service_type",
    default=Config.seldon_service_type,
    help="Seldon style: seldon-core's service type (MODEL, ROUTER, TRANSFORMER, COMBINER, "
    "OUTPUT_TRANSFORMER, OUTLIER_DETECTOR); each route answers by the methods the class has, "
    "as in seldon-core. A flag only: SERVICE_TYPE is ABEJA Platform's variable (HTTP).",
)
@click.option(
    "--model-name",
    envvar="ABEJA_RUNTIME_MODEL_NAME",
    show_envvar=True,
    default=Config.model_name,
    show_default=True,
    help="KServe style: the model's name in /v1/models/NAME and /v2/models/NAME.",
)
@click.option(
    "--grpc-port",
    envvar="ABEJA_RUNTIME_GRPC_PORT",
    show_envvar=True,
    type=click.IntRange(1, 65535),
    default=None,
    help="KServe and Seldon styles: serve their gRPC protocol on this port too, as KServe's "
    "--grpc_port (Open Inference V2) and seldon-core's --grpc-port do.  [default: off]",
)
@click.option(
    "--cortex-model",
    envvar="ABEJA_RUNTIME_CORTEX_MODEL",
    show_envvar=True,
    default="",
    help="Cortex style: the ONNX model file or TensorFlow SavedModel directory, relative to "
    "the handler's directory.  [default: the one *.onnx file or SavedModel directory in the "
    "training-result or handler directory]",
)
@click.option(
    "--cortex-metadata",
    envvar="ABEJA_RUNTIME_CORTEX_METADATA",
    show_envvar=True,
    type=JsonObject("ABEJA_RUNTIME_CORTEX_METADATA"),
    default="{}",
    help="Cortex style: JSON object passed as the metadata argument of "
    "pre_inference/post_inference.  [default: {}]",
)
@click.version_option(__version__, "--version", prog_name="abeja-runtime")
def main(**options: Any) -> None:
    """Serve an ABEJA Platform model handler over HTTP.

    Run it in the folder of your main.py. Every option can also be set with the environment
    variable shown; a .env file in the current directory is read for variables that are unset.
    """
    from abeja_runtime.supervisor import run

    sys.exit(run(_config(**options)))


def _config(**options: Any) -> Config:
    """The settings, with the platform's ids from the environment; a bad value is a usage
    error (one line, exit 2)."""
    try:
        return Config(platform=PlatformIds.from_environ(os.environ), **options)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


#: Options of the server that a batch run has no use for.
_SERVER_ONLY: Final = frozenset(
    {
        "host",
        "port",
        "healthcheck_port",
        "workers",
        "grace_period",
        "keepalive_timeout",
        "request_head_timeout",
        "grpc_port",
        "loop",
    }
)


def _batch(inputs: tuple[Path, ...], output: Path, **options: Any) -> None:
    """Run the handler once per input, without a server.

    \b
    With no INPUTS, the one input is what ABEJA Platform's one-shot runs read: the INPUT
    variable (JSON, or {"$datalake:1": "<channel>/<file>"}), and the answer goes where OUTPUT
    says ({"$datalake:1": "<channel>"}) or to stdout.
    With INPUTS (files, folders), each file is one POST of its bytes, and its answer is
    written under --output as the file's name plus the answer's extension
    (cat.jpg -> OUTPUT/cat.jpg.json). Exit code 1 when any answer is above 299.
    """
    from abeja_runtime.batch import BatchError, run_batch

    config = _config(**options)
    try:
        code = run_batch(config, inputs, output)
    except BatchError as exc:
        raise click.UsageError(str(exc)) from None
    sys.exit(code)


batch = click.Command(
    "batch",
    callback=_batch,
    help=_batch.__doc__,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    params=[
        click.Argument(["inputs"], nargs=-1, type=click.Path(path_type=Path)),
        click.Option(
            ["--output"],
            type=click.Path(file_okay=False, path_type=Path),
            default=Path("batch-output"),
            show_default=True,
            help="Folder for the answers to INPUTS (created when missing).",
        ),
        *(param for param in main.params if param.name not in _SERVER_ONLY),
    ],
)


def _kserve(script: str, arguments: tuple[str, ...]) -> None:
    """Serve a KServe model file unchanged.

    SCRIPT runs as __main__ (with sys.argv as KServe's server would have it) until it calls
    ModelServer().start([model]), and the runtime serves that model. KServe's --http_port
    (8080), --grpc_port (8081), --enable_grpc (true) and --workers (1) set the ports and
    workers; --model_name, --predictor_host, --protocol and the rest are the script's and
    kserve's, as with `python SCRIPT`. Every other setting of the runtime comes from its
    environment variables (abeja-runtime --help lists them).

    \b
    abeja-runtime kserve model.py --model_name custom-model --http_port 8080
    """
    serving = _kserve_parser()
    try:
        known, _ = serving.parse_known_args(arguments)
    except argparse.ArgumentError as exc:
        raise click.UsageError(str(exc)) from None
    with main.make_context("abeja-runtime", []) as context:  # the environment's settings
        options = dict(context.params)
    options.update(
        handler=script,
        style="kserve",
        port=known.http_port,
        workers=known.workers,
        grpc_port=known.grpc_port if known.enable_grpc else None,
        kserve_docs=known.enable_docs_url,
    )
    from abeja_runtime.supervisor import run

    sys.exit(run(_config(kserve_script=(script, *arguments), **options)))


def _kserve_parser() -> argparse.ArgumentParser:
    """The arguments of KServe's ModelServer that decide what the runtime listens on."""
    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    parser.add_argument("--http_port", type=int, default=8080)
    parser.add_argument("--grpc_port", type=int, default=8081)
    parser.add_argument("--enable_grpc", type=parse_bool, default=True)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--enable_docs_url", type=parse_bool, default=False)
    return parser


kserve = click.Command(
    "kserve",
    callback=_kserve,
    help=_kserve.__doc__,
    options_metavar=None,
    # Everything after SCRIPT is the script's: KServe's flags are not ours to parse or refuse.
    context_settings={
        "help_option_names": ["-h", "--help"],
        "max_content_width": 100,
        "ignore_unknown_options": True,
        "allow_interspersed_args": False,
    },
    params=[
        click.Argument(["script"]),
        click.Argument(
            ["arguments"], nargs=-1, type=click.UNPROCESSED, metavar="[KSERVE ARGUMENTS]..."
        ),
    ],
)

#: The commands besides serving, by the first argument that names them.
_SUBCOMMANDS: Final = {"batch": batch, "kserve": kserve}


def cli() -> None:
    """Console-script entry: reads ``.env``, then runs :func:`main` (or ``batch`` or ``kserve``,
    when the first argument names one) with one-line usage errors."""
    load_dotenv(Path.cwd() / ".env", override=False)
    args = sys.argv[1:]
    command, name = main, "abeja-runtime"
    if args[:1] and args[0] in _SUBCOMMANDS:
        command, name, args = _SUBCOMMANDS[args[0]], f"abeja-runtime {args[0]}", args[1:]
    try:
        command.main(args, standalone_mode=False, prog_name=name)
    except click.ClickException as exc:
        click.echo(f"abeja-runtime: error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except click.Abort:
        sys.exit(1)
