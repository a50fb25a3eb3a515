"""The ``abeja-runtime`` command: flags and environment → :class:`Config` → ``run(config)``.

Every option is generated from a declared setting (:mod:`abeja_runtime.options`): the core's
and each style's, each with its environment variable (the names are fixed by the contract);
click gives the precedence command line > environment > default. ``.env`` in the start
directory fills in variables that are not set yet. A bad value is one line on stderr and exit 2,
and so is a ``--warmup`` file that is missing, unreadable or not the JSON its name says.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any, Final

import click

from abeja_runtime import __version__
from abeja_runtime.config import Config, PlatformIds
from abeja_runtime.options import click_option, core_settings, split_options, style_settings
from abeja_runtime.request_files import WARMUP_FILE, RequestFileError, read_request_file, resolve

__all__ = ["batch", "cli", "main"]

_CONTEXT: Final = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
_SETTINGS: Final = (*core_settings(), *(setting for _, setting in style_settings()))


def _serve(**options: Any) -> None:
    """Serve an ABEJA Platform model handler over HTTP.

    Run it in the folder of your main.py. Every option can also be set with the environment
    variable shown; a .env file in the current directory is read for variables that are unset.
    """
    sys.exit(_run(_config(**options)))


def _run(config: Config) -> int:
    from abeja_runtime.front import lean_aiohttp

    lean_aiohttp.install()  # before the front's modules import aiohttp: its client stays out
    from abeja_runtime.front.supervisor import run

    return run(config)


def _config(**options: Any) -> Config:
    """The settings, with the platform's ids from the environment; a bad value is a usage
    error (one line, exit 2)."""
    try:
        core, styles = split_options(options)
        config = Config(platform=PlatformIds.from_environ(os.environ), style_options=styles, **core)
        return _warmup_checked(config)
    except (ValueError, RequestFileError) as exc:
        raise click.UsageError(str(exc)) from None


def _warmup_checked(config: Config) -> Config:
    """Each ``--warmup`` file read once here, before any worker starts, so that a bad one
    stops the start with one line rather than keep every worker out of readiness. The paths
    become absolute: they are given from the start directory, and the workers run in the code
    directory (``project.py``'s ``prepare_workdir``)."""
    if not config.warmup:
        return config
    base = Path.cwd()
    for path in config.warmup:
        read_request_file(path, base, WARMUP_FILE)
    return dataclasses.replace(
        config, warmup=tuple(str(resolve(path, base)) for path in config.warmup)
    )


main = click.Command(
    "abeja-runtime",
    callback=_serve,
    help=_serve.__doc__,
    context_settings=_CONTEXT,
    epilog="\b\nOther commands (each with its own --help):\n"
    "  abeja-runtime batch [INPUTS]...   run the handler once per input, without a server\n"
    "  abeja-runtime kserve SCRIPT ...   serve a KServe model file unchanged",
    params=[click_option(setting) for setting in _SETTINGS],
)
click.version_option(__version__, "--version", prog_name="abeja-runtime")(main)


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
    from abeja_runtime.batch_job.job import BatchJobError, run_batch_job

    config = _config(**options)
    try:
        code = run_batch_job(config, inputs, output)
    except BatchJobError as exc:
        raise click.UsageError(str(exc)) from None
    sys.exit(code)


batch = click.Command(
    "batch",
    callback=_batch,
    help=_batch.__doc__,
    context_settings=_CONTEXT,
    params=[
        click.Argument(["inputs"], nargs=-1, type=click.Path(path_type=Path)),
        click.Option(
            ["--output"],
            type=click.Path(file_okay=False, path_type=Path),
            default=Path("batch-output"),
            show_default=True,
            help="Folder for the answers to INPUTS (created when missing).",
        ),
        *(click_option(setting) for setting in _SETTINGS if not setting.server_only),
    ],
)


def _command(name: str) -> click.Command | None:
    """The command besides serving that the first argument names, if it names one."""
    if name == "batch":
        return batch
    if name == "kserve":
        from abeja_runtime.styles.kserve.command import kserve_command

        return kserve_command(main, _config, _run)
    return None


def cli() -> None:
    """Console-script entry: reads ``.env``, then runs :func:`main` (or ``batch`` or ``kserve``,
    when the first argument names one) with one-line usage errors."""
    dotenv = Path.cwd() / ".env"
    if dotenv.is_file():
        # Imported here: the front holds python-dotenv only when there is a file to read.
        from dotenv import load_dotenv

        load_dotenv(dotenv, override=False)
    args = sys.argv[1:]
    command, name = main, "abeja-runtime"
    other = _command(args[0]) if args else None
    if other is not None:
        command, name, args = other, f"abeja-runtime {args[0]}", args[1:]
    try:
        command.main(args, standalone_mode=False, prog_name=name)
    except click.ClickException as exc:
        click.echo(f"abeja-runtime: error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except click.Abort:
        sys.exit(1)
