"""The ``abeja`` command: root group → ``model`` group → one module per command.

Commands import Docker and the engines only when they run, so ``abeja --help`` stays fast.
"""

from __future__ import annotations

import click

from abeja_cli.build import build
from abeja_cli.clean import clean
from abeja_cli.init import init
from abeja_cli.manifests import manifests
from abeja_cli.run_batch import run_batch
from abeja_cli.run_local import run_local
from abeja_cli.run_local_server import run_local_server

__all__ = ["abeja", "model"]


# -h is help wherever it means nothing else; the model commands (session.ModelCommand) keep it
# for the handler, as ABEJA's CLI does, and say so when it is given alone.
@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="abeja-runtime", prog_name="abeja")
def abeja() -> None:
    """Run ABEJA Platform model handlers locally, with abeja-runtime."""


@abeja.group()
def model() -> None:
    """Run a model handler (main.py) on this machine, and take it to production."""


model.add_command(run_local)
model.add_command(run_local_server)
model.add_command(run_batch)
model.add_command(build)
model.add_command(manifests)
model.add_command(clean)
model.add_command(init)
