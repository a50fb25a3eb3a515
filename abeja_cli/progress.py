"""Progress of the long steps of a command: a Docker build's phases, a requirements install.

A user sees one ``[info]`` line per phase, with how long it took, and, while a phase goes on, a
line every :data:`PROGRESS_EVERY` seconds; when pip (or uv) is at work, that line says what it
is doing (``Downloading torch-2.3.0-...whl (779.1 MB)``), so a long install is not a bare timer.
The tools' whole output is shown with ``-v`` only.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from typing import Final

__all__ = ["PROGRESS_EVERY", "Phases", "pip_step"]

#: While a phase goes on, a line says so this often: a first build spends a minute on the
#: runtime's wheels, a requirements install minutes on a large download; neither may look
#: like a hang, and a line every few seconds would drown the rest.
PROGRESS_EVERY: Final = 10.0
#: The lines of pip (and of uv) that begin a step of an install.
_STEP_RE: Final = re.compile(
    r"^\s*(Collecting|Downloading|Obtaining|Processing|Preparing metadata|Building wheels? for"
    r"|Installing build dependencies|Getting requirements to build|Installing collected packages"
    r"|Using cached|Resolved|Prepared|Installed|Downloaded|Building)\b"
)
_URL_RE: Final = re.compile(r"\S+://\S*/([^/\s]+)")
#: A step is shown on one line: longer ones (a list of a hundred packages) are cut.
_STEP_WIDTH: Final = 120


def pip_step(line: str) -> str | None:
    """The line, shortened, when it says what pip or uv is doing now; None otherwise.

    pip names a download from another index than PyPI by its whole URL: the file name is
    what tells the user which package it is.
    """
    if not _STEP_RE.match(line):
        return None
    text = _URL_RE.sub(r"\1", line.strip())
    return text if len(text) <= _STEP_WIDTH else text[: _STEP_WIDTH - 3] + "..."


class Phases:
    """One line per phase as it ends, and a line every :data:`PROGRESS_EVERY` seconds while
    it goes on, naming the install step that the phase's output (:meth:`output`) last showed.
    """

    def __init__(self, info: Callable[[str], None], *, every: float = PROGRESS_EVERY) -> None:
        self._info = info
        self._every = every
        self._lock = threading.Lock()
        self._current: tuple[str, str] | None = None  # (what it did, what it is doing)
        self._step: str | None = None
        self._started = 0.0
        self._ticker: threading.Thread | None = None
        self._phase_changed = threading.Event()

    @property
    def current(self) -> str | None:
        """What the running phase says once it has ended, or None."""
        with self._lock:
            return self._current[0] if self._current is not None else None

    def start(self, done: str, doing: str) -> None:
        """A phase begins: ``doing`` names it while it runs, ``done`` once it has ended."""
        self.end()
        with self._lock:
            self._current, self._started, self._step = (done, doing), time.monotonic(), None
            self._phase_changed.clear()
        self._ticker = threading.Thread(target=self._tick, name="progress", daemon=True)
        self._ticker.start()

    def output(self, line: str) -> None:
        """A line of the running phase's output: remembered when it begins an install step."""
        step = pip_step(line)
        if step is not None:
            with self._lock:
                self._step = step

    def abandon(self) -> None:
        """The phase failed: its error says so, not a time."""
        self._stop(report=False)

    def end(self) -> None:
        self._stop(report=True)

    def _stop(self, *, report: bool) -> None:
        with self._lock:
            current, self._current = self._current, None
            self._phase_changed.set()
        if self._ticker is not None:
            self._ticker.join()
            self._ticker = None
        if current is not None and report:
            self._info(f"{current[0]} ({time.monotonic() - self._started:.1f} s)")

    def _tick(self) -> None:
        while not self._phase_changed.wait(self._every):
            with self._lock:
                if self._current is None:
                    return
                took = f"{time.monotonic() - self._started:.0f} s"
                step = f"; pip: {self._step}" if self._step else ""
                line = f"{self._current[1]}... ({took}{step})"
            self._info(line)
