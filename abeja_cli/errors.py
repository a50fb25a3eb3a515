"""Exceptions of the CLI.

Lower layers raise these; only the command edge (``run_local``, ``run_local_server``) turns
them into one ``[error]`` line and an exit code, so every module stays testable without
``sys.exit``.
"""

from __future__ import annotations

__all__ = [
    "BuildError",
    "CliError",
    "EngineUnavailable",
    "InputError",
    "ServerError",
]


class CliError(Exception):
    """An error the user can act on: ``message`` is shown as one ``[error]`` line.

    ``exit_code`` follows the contract: 1 for runtime, model and Docker errors, 2 for usage
    and input errors. ``log`` is extra text (a build log, a server log) shown after the line.
    """

    exit_code = 1

    def __init__(self, message: str, *, log: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.log = log


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


class ServerError(CliError):
    """The model server failed to start, died, or could not be reached; ``log`` is its log."""
