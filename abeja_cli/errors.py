"""Exceptions of the CLI: click's own, shown as one ``[error]`` line and exited with their code.

Lower layers raise these and never call ``sys.exit``, so every module stays testable; click
shows an error wherever in a command it was raised (:meth:`CliError.show`) and exits with its
``exit_code``. A command runs its body with :func:`abeja_cli.session.reported`, which gives the
error the command's console (whether ``-q`` or ``-v`` was given decides whether a log is shown).
"""

from __future__ import annotations

from typing import IO, Any, TextIO, cast

import click

from abeja_cli.console import Console

__all__ = [
    "BuildError",
    "CliError",
    "EngineUnavailable",
    "InputError",
    "ServerError",
]


class CliError(click.ClickException):
    """An error the user can act on: ``message`` is shown as one ``[error]`` line.

    ``exit_code`` follows the contract: 1 for runtime, model and Docker errors, 2 for usage
    and input errors. ``log`` is extra text (a build log, a server log) shown after the line
    where it was not on screen already.
    """

    exit_code = 1
    #: The title of the block that shows ``log``.
    log_title = "Local Server Error"

    def __init__(self, message: str, *, log: str = "") -> None:
        super().__init__(message)
        self.log = log
        #: The console of the command that raised it (see :func:`abeja_cli.session.reported`).
        self.console: Console | None = None

    def log_was_shown(self, console: Console) -> bool:
        """Whether ``log`` was on screen as it came: the model's log is, unless ``-q``."""
        return not console.quiet

    def show(self, file: IO[Any] | None = None) -> None:
        console = self.console or Console(stream=cast(TextIO, file))
        console.error(self.message)
        if self.log and not self.log_was_shown(console):
            console.block(self.log_title, self.log)


class InputError(CliError):
    """A bad option value or input file, found before anything is built or started."""

    exit_code = 2


class EngineUnavailable(CliError):
    """The chosen engine cannot be used at all (Docker unreachable, runtime not installed).

    ``message`` says why; ``hint`` what to do when this engine was asked for explicitly.
    Without an explicit ``--engine`` the CLI uses the local engine instead.
    """

    def __init__(self, message: str, *, hint: str = "") -> None:
        super().__init__(f"{message}; {hint}" if hint else message)
        self.reason = message


class BuildError(CliError):
    """Building the image failed; ``log`` holds the build output up to the failing step."""

    log_title = "Build Log"

    def log_was_shown(self, console: Console) -> bool:
        """A build's output is on screen as it comes only with ``-v``."""
        return console.verbose


class ServerError(CliError):
    """The model server failed to start, died, or could not be reached; ``log`` is its log."""
