"""``abeja model run-batch``: run the model once per input file, as a one-shot batch.

The engine runs ``abeja-runtime batch`` itself (in the project's container, or with this
Python), so the model meets exactly what a one-shot run on the platform gives it: with no
INPUTS, the ``INPUT``/``OUTPUT`` variables (``-e INPUT='{...}'``); with INPUTS, one request per
file and one answer per request under ``--output``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from abeja_cli.console import Console
from abeja_cli.engine import BatchSpec
from abeja_cli.errors import InputError
from abeja_cli.server_log import LogSink
from abeja_cli.session import (
    ModelCommand,
    ModelOptions,
    model_options,
    prepare_engine,
    reported,
    terminate_as_interrupt,
)

__all__ = ["run_batch"]


@click.command("run-batch", cls=ModelCommand)
@model_options(
    "handler",
    "image",
    "device_type",
    "environment",
    "env_file",
    "organization_id",
    "no_cache",
    "v1",
    "engine",
    "inherit_env",
    "timeout",
    "max_body_size",
    "max_batch_size",
    "verbose",
)
@click.argument("inputs", nargs=-1, type=click.Path(exists=True, path_type=Path))
@click.option(
    "--output",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("batch-output"),
    show_default=True,
    help="Folder for the answers to INPUTS: each input's name plus the answer's extension "
    "(cat.jpg -> cat.jpg.json).",
)
@click.option(
    "-q", "--quiet", is_flag=True, help="Print only the summary: no progress, build output or logs."
)
def run_batch(**params: Any) -> None:
    """Run the model in the current folder once per input file (or folder of files).

    \b
    abeja model run-batch -h main:handler images/ --output answers/
    abeja model run-batch -h main:handler -e INPUT='{"total_without_tax": 100}'

    With no INPUTS, the one input is what ABEJA Platform's one-shot runs read: -e INPUT
    (JSON, or {"$datalake:1": "<channel>/<file>"}), answered on stdout unless -e OUTPUT names
    a DataLake channel. Exit code 1 when any answer's status is above 299.
    """
    console = Console(quiet=params["quiet"], verbose=params["verbose"])
    reported(console, lambda: _run(params, console))


def _run(params: dict[str, Any], console: Console) -> int:
    options = ModelOptions.from_params(params)
    inputs = tuple(path.resolve() for path in params["inputs"])
    output = None
    if inputs:
        output = params["output"].resolve()
        if output.exists() and not output.is_dir():
            raise InputError(f"--output {params['output']} is a file; name a folder")
        output.mkdir(parents=True, exist_ok=True)  # a Docker bind mount needs it to exist
    batch = BatchSpec(inputs=inputs, output=output)
    engine, spec = prepare_engine(options, console)
    described = f"{len(inputs)} input path(s)" if inputs else "the INPUT variable"
    console.info(f"running the batch over {described}")
    sink = LogSink(console, show=not console.quiet)
    with terminate_as_interrupt():
        code = engine.run_batch(spec, batch, sink, sys.stdout.buffer)
    sys.stdout.flush()
    if code not in (0, 1):
        console.error(f"the batch stopped with exit code {code}; its log above says why")
    return code
