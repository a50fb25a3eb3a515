"""``abeja-runtime kserve SCRIPT [KSERVE ARGUMENTS]...``: a KServe model file served unchanged.

KServe's ``ModelServer`` arguments that decide what the runtime listens on are read here; the
script itself reads the rest, as with ``python SCRIPT`` (:mod:`.script`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import click

from abeja_runtime.config import Config, parse_bool

__all__ = ["kserve_command"]


def kserve_command(
    runtime: click.Command, configure: Callable[..., Config], run: Callable[[Config], int]
) -> click.Command:
    """The ``kserve`` command; every other setting comes from ``runtime``'s variables."""

    def serve(script: str, arguments: tuple[str, ...]) -> None:
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
        try:
            known, _ = _parser().parse_known_args(arguments)
        except argparse.ArgumentError as exc:
            raise click.UsageError(str(exc)) from None
        with runtime.make_context("abeja-runtime", []) as context:  # the environment's settings
            options: dict[str, Any] = dict(context.params)
        options.update(
            handler=script,
            style="kserve",
            port=known.http_port,
            workers=known.workers,
            grpc_port=known.grpc_port if known.enable_grpc else None,
            kserve_docs=known.enable_docs_url,
            kserve_script=(script, *arguments),
        )
        raise SystemExit(run(configure(**options)))

    return click.Command(
        "kserve",
        callback=serve,
        help=serve.__doc__,
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


def _parser() -> argparse.ArgumentParser:
    """The arguments of KServe's ModelServer that decide what the runtime listens on."""
    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    parser.add_argument("--http_port", type=int, default=8080)
    parser.add_argument("--grpc_port", type=int, default=8081)
    parser.add_argument("--enable_grpc", type=parse_bool, default=True)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--enable_docs_url", type=parse_bool, default=False)
    return parser
