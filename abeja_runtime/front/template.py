"""The front's side of preforking (``--preload``, :class:`Template`, the pool's
:class:`~abeja_runtime.front.processes.Launcher`): the template process that imports the handler
once (``worker/template.py``), and the handler processes forked from it.

The processes asked for while the template loads wait; once it says
:class:`~abeja_runtime.frames.Loaded`, each is a :class:`~abeja_runtime.frames.Fork` (with its
socket's end), answered in order by a :class:`~abeja_runtime.frames.Forked` pid: the template
forks through a middle process that exits, and the front, a child subreaper, adopts every
handler process. Where a fork is not safe (the template says why), every process is a fresh
interpreter instead, as with ``--preload off``. A template that dies is started again (a full
import), with back-off; the processes forked from it are not affected.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import enum
import logging
import os
import socket
from collections import deque
from collections.abc import Callable
from typing import Final

from abeja_runtime.config import Config
from abeja_runtime.frames import Fork, Forked, Frame, Loaded, LoadFailed
from abeja_runtime.front.processes import (
    Adopted,
    FreshInterpreter,
    HandlerProcess,
    Launcher,
    backoff,
    describe_exit,
    reap,
)

__all__ = ["Template", "adopt_orphans"]

_log = logging.getLogger("abeja_runtime")
#: prctl(PR_SET_CHILD_SUBREAPER): the processes the template forks become the front's children.
_PR_SET_CHILD_SUBREAPER: Final = 36


def adopt_orphans() -> bool:
    """Make the front the parent of the orphans of its descendants (Linux 3.4), which it watches
    through pidfds (Linux 5.3): whether it can."""
    with contextlib.suppress(OSError, AttributeError):
        os.close(os.pidfd_open(os.getpid()))
        return bool(ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1) == 0)
    return False


class _Stage(enum.Enum):
    LOADING = "loading"  # importing the handler: processes asked for wait
    FORKING = "forking"  # loaded: each process asked for is forked
    REFUSED = "refused"  # a fork is not safe: each process is a fresh interpreter
    STOPPED = "stopped"  # no process is started any more


class Template:
    """The template process, and the handler processes the pool asks of it."""

    def __init__(
        self,
        config: Config,
        environment: dict[str, str],
        load_failed: Callable[[str, str], None],
        loaded: Callable[[], None] | None = None,
    ) -> None:
        """``load_failed``: the handler could not be loaded (text, details); ``loaded``: it is
        loaded the first time (a reload's template: the reload logs it; else the template)."""
        self._config = config
        self._environment = environment
        self._load_failed = load_failed
        self._on_loaded = loaded or (lambda: None)
        self._announce = loaded is None
        self._fresh = FreshInterpreter()
        self._stage = _Stage.LOADING
        self._process: HandlerProcess | None = None
        #: Asked for while the template loads: each process, its socket's end, its environment.
        self._waiting: deque[tuple[HandlerProcess, socket.socket, dict[str, str]]] = deque()
        #: Forks asked of the template and not answered yet, in order.
        self._forking: deque[HandlerProcess] = deque()
        self._loaded_once = False
        self._deaths = 0

    def start(self, launcher: Launcher | None = None) -> None:
        """Start the template's process, a fresh interpreter unless ``launcher`` is given (the
        interpreter the front started already)."""
        launcher = launcher or FreshInterpreter()
        self._process = HandlerProcess(
            self._config, self._environment, self, launcher, template=True
        )

    @property
    def pid(self) -> int:
        """The template process's pid (0: none now)."""
        return self._process.pid if self._process is not None else 0

    @property
    def refused(self) -> bool:
        """A fork was not safe: each process is a fresh interpreter."""
        return self._stage is _Stage.REFUSED

    def stop(self) -> None:
        """No process is started any more; those waiting count as failed launches, and the
        template exits (at once if it is still importing the handler)."""
        loading = self._stage is _Stage.LOADING
        self._stage = _Stage.STOPPED
        while self._waiting:
            process, theirs, _ = self._waiting.popleft()
            theirs.close()
            process.launch_failed()
        if self._process is not None:
            self._process.close_socket()
            if loading:
                self._process.kill()

    def kill(self) -> None:
        self.stop()
        if self._process is not None:
            self._process.kill()

    # -- the launcher -------------------------------------------------------------------------

    def channel(self) -> tuple[socket.socket, socket.socket]:
        return socket.socketpair()

    def launch(
        self, process: HandlerProcess, theirs: socket.socket, environment: dict[str, str]
    ) -> None:
        if self._stage is _Stage.REFUSED:
            self._fresh.launch(process, theirs, environment)
            return
        if self._stage is _Stage.STOPPED:
            theirs.close()
            process.launch_failed()
            return
        self._waiting.append((process, theirs, environment))
        if self._stage is _Stage.FORKING:
            self._fork_waiting()

    def _fork_waiting(self) -> None:
        assert self._process is not None
        while self._waiting:
            process, theirs, environment = self._waiting.popleft()
            added = tuple(
                (name, value)
                for name, value in environment.items()
                if self._environment.get(name) != value
            )
            with theirs:
                self._process.send(Fork(added), theirs.fileno())  # (sends a duplicate)
            self._forking.append(process)

    # -- the template's frames and exit -------------------------------------------------------

    def received(self, frame: Frame, fd: int | None) -> None:
        match frame:
            case Forked() if self._forking:
                process = self._forking.popleft()
                if frame.pid:
                    process.adopt(Adopted(frame.pid))
                else:
                    process.launch_failed(frame.error)
            case Loaded():
                self._loaded(frame.hazard)
            case LoadFailed() if self._loaded_once:  # started again: its exit starts it again
                _log.error("the template process could not load the handler: %s", frame.text)
            case LoadFailed():
                self._load_failed(frame.text, frame.details)
                self.stop()

    def _loaded(self, hazard: str) -> None:
        if self._stage is not _Stage.LOADING:
            return
        assert self._process is not None
        if hazard:
            _log.warning(
                "each worker imports the handler itself (no --preload): %s; start the runtime "
                "with --preload off to say so and load it once less",
                hazard,
            )
            self._stage = _Stage.REFUSED
            self._process.close_socket()
            while self._waiting:
                process, theirs, environment = self._waiting.popleft()
                try:
                    self._fresh.launch(process, theirs, environment)
                except OSError as exc:
                    process.launch_failed(str(exc))
            self._on_loaded()
            return
        first = not self._loaded_once
        if first and self._announce:
            _log.info(
                "the handler is imported once, in the template process %s: every worker is "
                "forked from it (--preload)",
                self._process.pid,
            )
        self._loaded_once = True
        self._deaths = 0
        self._stage = _Stage.FORKING
        self._fork_waiting()
        if first:
            self._on_loaded()

    def exited(self) -> None:
        """The template exited: the forks it did not answer failed; a new one is started."""
        process = self._process
        if process is None or process.child is None:
            return
        how = describe_exit(reap(process))  # (the Forked and Loaded it wrote are taken in)
        self._process = None
        why = "" if self._stage is _Stage.STOPPED else f"the template exited ({how})"
        while self._forking:
            self._forking.popleft().launch_failed(why)
        if self._stage is not _Stage.FORKING and self._stage is not _Stage.LOADING:
            return  # stopped, or refused and gone as it should
        if not self._loaded_once:
            self._stage = _Stage.STOPPED
            self._load_failed(f"the template exited ({how}) while loading the handler", "")
            return
        self._deaths += 1
        delay = backoff(self._deaths)
        _log.error("the template process exited (%s); starting it again in %g s", how, delay)
        self._stage = _Stage.LOADING
        asyncio.get_running_loop().call_later(delay, self._restart)

    def _restart(self) -> None:
        if self._stage is _Stage.LOADING and self._process is None:
            self.start()
