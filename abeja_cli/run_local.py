"""``abeja model run-local``: start the model, send it one request, print the answer."""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import click

from abeja_cli.client import answer_timeout, send
from abeja_cli.console import Console
from abeja_cli.errors import InputError
from abeja_cli.inputs import METHODS, ModelRequest, build_request
from abeja_cli.output import write_response
from abeja_cli.server_log import LogSink
from abeja_cli.session import (
    ModelCommand,
    ModelOptions,
    model_options,
    reported,
    start_server,
    terminate_as_interrupt,
)
from abeja_runtime.config import Config
from abeja_runtime.options import setting_named

__all__ = ["run_local"]

_MIB: Final = 1024 * 1024


@click.command("run-local", cls=ModelCommand)
@model_options()
@click.option(
    "--input",
    "inputs",
    multiple=True,
    metavar="PATH | NAME=@PATH | NAME=VALUE",
    help="Request body file (Content-Type from its extension; - for stdin), or, repeated, "
    "the fields of a multipart/form-data request.",
)
@click.option(
    "--content-type", default=None, help="Content-Type of the body instead of the guessed one."
)
@click.option(
    "--method",
    type=click.Choice(METHODS, case_sensitive=False),
    default="POST",
    show_default=True,
    help="HTTP method; GET sends the NAME=VALUE inputs (or a file's text) as the query.",
)
@click.option(
    "--path",
    default="/",
    show_default=True,
    help="URL path of the request (ABEJA handlers ignore it; other handler styles route on it).",
)
@click.option(
    "--output",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the raw response body to this file instead of stdout.",
)
@click.option(
    "-q", "--quiet", is_flag=True, help="Print only the answer: no progress, build output or logs."
)
def run_local(**params: Any) -> None:
    """Run the model in the current folder and send it one request.

    \b
    abeja model run-local -h main:handler --input request.json
    """
    console = Console(quiet=params["quiet"], verbose=params["verbose"])
    reported(console, lambda: _run(params, console))


def _run(params: dict[str, Any], console: Console) -> int:
    options = ModelOptions.from_params(params)
    request = build_request(
        params["inputs"],
        method=params["method"],
        content_type=params["content_type"],
        base_dir=options.project,
        path=params["path"],
    )
    _check_body_size(request, params["inputs"], options.env)
    output = Path(params["output"]) if params["output"] else None
    if output is not None and not output.resolve().parent.is_dir():
        raise InputError(f"--output {output}: the folder {output.parent} does not exist")
    sink = LogSink(console, show=not console.quiet)
    with terminate_as_interrupt(), start_server(options, console, sink) as (_engine, server):
        console.info(
            f"sending request to model: {request.method} {request.target} {request.summary}"
        )
        response = send(
            server.url,
            request,
            timeout=answer_timeout(options.env),
            progress=console.info,
            on_chunk=None if output is not None else _print_now,
        )
    # The server is gone now, so its log stream has ended: show its last lines before the answer.
    server.drain_logs()
    console.info(f"finish requesting to model: {response.status} {response.reason}")
    return write_response(response, console=console, stdout=sys.stdout.buffer, output=output)


def _print_now(piece: bytes) -> None:
    """A piece of a streamed answer, on stdout as it arrives."""
    sys.stdout.buffer.write(piece)
    sys.stdout.buffer.flush()


def _check_body_size(
    request: ModelRequest, inputs: tuple[str, ...], env: Mapping[str, str]
) -> None:
    """A body over the model server's limit is refused before anything starts: the server
    answers 413 and closes the connection while the body is still being sent, which the
    sender only sees as "Connection reset by peer" or "Broken pipe"."""
    limit = _body_limit(env)
    size = len(request.body)
    if not limit or size <= limit:
        return
    named = " ".join(f"--input {spec}" for spec in inputs)
    raise InputError(
        f"{named}: the request body is {_size(size)}, over the model server's limit of "
        f"{_size(limit)}, so it would be refused (413) before it is sent whole; raise the "
        f"limit with --max-body-size {math.ceil(size / _MIB)}MiB (0: no limit)"
    )


def _body_limit(env: Mapping[str, str]) -> int:
    """The limit as the model gets it (--max-body-size, -e or --env-file), read the way the
    option reads it; the runtime's default when unset. 0: no limit."""
    text = env.get(str(setting_named("max_body_size").envvar))
    if text is None:
        return Config.max_body_size
    context = click.get_current_context()
    option = next(param for param in context.command.params if param.name == "max_body_size")
    try:
        return int(option.type.convert(text, option, context))
    except click.BadParameter:  # the runtime refuses it at start-up, in its own words
        return 0


def _size(size: int) -> str:
    if size >= _MIB:
        return f"{size / _MIB:.1f} MiB"
    return f"{size / 1024:.1f} KiB" if size >= 1024 else f"{size} bytes"
