"""A handler process as a fresh interpreter (``python -m abeja_runtime.worker FD FRONT_PID``), and
the first one started before the front's own imports (:class:`Prestarted`): the template's with
``--preload``, else the first worker's, so that both import at once on two cores (it is told
what it is by its first frame, once the front's loop runs). This module imports nothing of the
front's loop, so that it comes before them.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from typing import Protocol

__all__ = ["Prestarted", "start_interpreter"]


class _Process(Protocol):
    """What a launcher tells of the process it started (``processes.HandlerProcess``)."""

    def adopt(self, child: subprocess.Popen[bytes]) -> None: ...


def start_interpreter(
    theirs: socket.socket, environment: dict[str, str]
) -> subprocess.Popen[bytes]:
    """A new interpreter that serves on ``theirs`` (a copy of it: the caller closes its own)."""
    fd = theirs.fileno()
    command = [sys.executable, "-m", "abeja_runtime.worker", str(fd), str(os.getpid())]
    return subprocess.Popen(command, pass_fds=(fd,), env=environment)


class Prestarted:
    """The first handler process's interpreter, started before the front's loop: the launcher of
    the first process started with the same environment."""

    def __init__(self, environment: dict[str, str]) -> None:
        """Raises ``OSError`` when it cannot be started (nothing is left open)."""
        self.environment = environment
        #: When it was started (``time.monotonic``): the runtime's own start ends there.
        self.started_at = time.monotonic()
        self._channel = socket.socketpair()
        try:
            self._popen = start_interpreter(self._channel[1], environment)
        except OSError:
            for end in self._channel:
                end.close()
            raise
        self._taken = False

    def channel(self) -> tuple[socket.socket, socket.socket]:
        return self._channel

    def launch(self, process: _Process, theirs: socket.socket, environment: dict[str, str]) -> None:
        theirs.close()
        self._taken = True
        process.adopt(self._popen)

    def discard(self) -> None:
        """Unless a process took it: it is stopped and reaped."""
        if self._taken:
            return
        for end in self._channel:
            end.close()
        self._popen.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(timeout=5)
