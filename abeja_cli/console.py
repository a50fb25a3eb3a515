"""Status lines of the CLI, on stderr so that stdout carries only the model's answer.

abeja-sdk's CLI printed ``[info]`` lines and container logs on stdout, so ``run-local > cat.jpg``
produced a broken image unless ``--quiet`` was given. Here stdout is reserved for the body.
"""

from __future__ import annotations

import sys
import threading
from typing import TextIO

import click

__all__ = ["Console"]


class Console:
    """Writes ``[info]`` / ``[error]`` lines and log lines; ``quiet`` silences all but errors.

    A lock keeps lines whole when the log-follower thread and the main thread print at once.
    """

    def __init__(
        self, *, quiet: bool = False, verbose: bool = False, stream: TextIO | None = None
    ) -> None:
        self.quiet = quiet
        #: Show the full build output as it comes (else only one line per build phase).
        self.verbose = verbose and not quiet
        self._stream = stream
        self._lock = threading.Lock()

    @property
    def stream(self) -> TextIO:
        return self._stream if self._stream is not None else sys.stderr

    def _write(self, text: str) -> None:
        with self._lock:
            click.echo(text, file=self.stream)

    def info(self, message: str) -> None:
        """An ``[info]`` progress line (hidden by ``-q``)."""
        if not self.quiet:
            self._write(f"[info] {message}")

    def notice(self, message: str) -> None:
        """An ``[info]`` line shown even with ``-q``: the result of a command that prints
        nothing else (init, clean, build), or why the answer is not printed. ``-q`` hides
        every other line of a successful run."""
        self._write(f"[info] {message}")

    def warning(self, message: str) -> None:
        """A ``[warning]`` line (hidden by ``-q``): it works, but maybe not as expected."""
        if not self.quiet:
            self._write(f"[warning] {message}")

    def error(self, message: str) -> None:
        """An ``[error]`` line; always shown."""
        self._write(f"[error] {message}")

    def log(self, line: str) -> None:
        """A line of build output or of the model's log (hidden by ``-q``)."""
        if not self.quiet:
            self._write(line)

    def detail(self, line: str) -> None:
        """A line of build output: shown only with ``-v``."""
        if self.verbose:
            self._write(line)

    def block(self, title: str, text: str) -> None:
        """A titled block of text (a build or server log after an error); always shown."""
        text = text.rstrip("\n")
        if not text:
            return
        self._write(f" ------ {title} ------ ")
        self._write(text)
