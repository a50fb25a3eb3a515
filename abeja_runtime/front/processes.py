"""The front's handler processes, one :class:`HandlerProcess` each: its start, its socket, the
frames that cross it, and its end. A process is started by a :class:`Launcher`: a fresh
interpreter (:class:`FreshInterpreter`, ``python -m abeja_runtime.worker FD FRONT_PID``), or a
fork of the template (``template.py``); never a fork of the front, whose state is not copied.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
from collections import deque
from typing import Final, Protocol

from abeja_runtime.config import Config
from abeja_runtime.frames import (
    FDS_PER_WRITE,
    VERSION,
    Frame,
    FrameDecoder,
    ProtocolError,
    Start,
    encode_frame,
    read_buffer,
    receive,
)
from abeja_runtime.front.interpreter import start_interpreter

__all__ = [
    "DEVICE_VARIABLE",
    "Adopted",
    "FrameSink",
    "FreshInterpreter",
    "HandlerProcess",
    "Launcher",
    "backoff",
    "describe_exit",
    "device_environment",
    "reap",
    "reap_orphans",
    "resident_memory",
]

_log = logging.getLogger("abeja_runtime")
_PAGE_SIZE: Final = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
#: The GPUs a process may use, as CUDA reads them (and PyTorch, TensorFlow, ONNX Runtime on it):
#: once, when it initialises, so it must be in the environment the process starts with.
DEVICE_VARIABLE: Final = "CUDA_VISIBLE_DEVICES"


class FrameSink(Protocol):
    """Where a process's frames go, and who hears of its exit."""

    def received(self, frame: Frame, fd: int | None) -> None: ...

    def exited(self) -> None: ...


class Launcher(Protocol):
    """Starts the process of a :class:`HandlerProcess` on ``theirs`` (its end of the socket from
    :meth:`channel`, which the launcher closes), now or later, and tells it
    (:meth:`HandlerProcess.adopt` or :meth:`HandlerProcess.launch_failed`)."""

    def channel(self) -> tuple[socket.socket, socket.socket]: ...

    def launch(
        self, process: HandlerProcess, theirs: socket.socket, environment: dict[str, str]
    ) -> None: ...


class FreshInterpreter:
    """Each process a new interpreter that imports the handler itself."""

    def channel(self) -> tuple[socket.socket, socket.socket]:
        return socket.socketpair()

    def launch(
        self, process: HandlerProcess, theirs: socket.socket, environment: dict[str, str]
    ) -> None:
        with theirs:
            popen = start_interpreter(theirs, environment)
        process.adopt(popen)


class Adopted:
    """A process forked from the template that the front adopted (a child subreaper): it waits
    for it as for a child it started itself. ``returncode`` given: one that has exited."""

    def __init__(self, pid: int, returncode: int | None = None) -> None:
        self.pid = pid
        self.returncode = returncode

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped as an orphan before its pid was known
                self.returncode = _UNKNOWN_EXIT
            else:
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            try:
                self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
            except ChildProcessError:  # reaped as an orphan before its pid was known
                self.returncode = _UNKNOWN_EXIT
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:  # until it is reaped, its pid is its own
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


#: The exit code of an adopted process whose own was lost (:func:`reap_orphans` took it).
_UNKNOWN_EXIT: Final = 1


def reap_orphans(known: set[int]) -> None:
    """Reap the front's exited children that are not ``known``: the orphans of its descendants
    (a handler's subprocesses, a template's middle processes), which come to the front as a
    child subreaper, and would stay zombies, each holding a pid."""
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            with open(f"/proc/self/task/{task}/children") as children:
                pids = [int(pid) for pid in children.read().split()]
            for pid in pids:
                if pid not in known and _exited(pid):
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(pid, os.WNOHANG)


def _exited(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return False


class HandlerProcess:
    """One handler process: its start, its socket, its end."""

    def __init__(
        self,
        config: Config,
        environment: dict[str, str],
        sink: FrameSink,
        launcher: Launcher,
        *,
        template: bool = False,
    ) -> None:
        """``template``: the process is the template (``template.py``)."""
        ours, theirs = launcher.channel()
        self._config = config
        self._template = template
        #: Set once the process exists (:meth:`adopt`; a fork comes a little later).
        self.child: subprocess.Popen[bytes] | Adopted | None = None
        self.pid = 0
        #: Readable once the process exits (``None``: not yet, or no pidfd on this system).
        self.exit_fd: int | None = None
        self._killed = False
        #: Its GPU, from ``--devices``.
        self.device = environment.get(DEVICE_VARIABLE) if config.devices else None
        self._sink = sink
        self._sock = ours
        ours.setblocking(False)
        self._decoder = FrameDecoder()
        self._into = read_buffer()
        #: Frames of this loop iteration, not written yet, and the descriptors they carry.
        self._batch: list[bytes] = []
        self._batch_fds: list[int] = []
        #: What the socket did not take yet.
        self._out: deque[tuple[memoryview, tuple[int, ...]]] = deque()
        self.loop = asyncio.get_running_loop()
        self.loop.add_reader(ours.fileno(), self.read_available)
        launcher.launch(self, theirs, environment)

    def adopt(self, child: subprocess.Popen[bytes] | Adopted) -> None:
        """The process exists: it is watched, and sent its settings."""
        self.child, self.pid = child, child.pid
        if self.device is not None:
            _log.info(
                "worker %s starts with %s=%s (--devices)", self.pid, DEVICE_VARIABLE, self.device
            )
        try:  # readable once the process exits
            self.exit_fd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):  # none on this system: the watch polls
            self.exit_fd = None
        else:
            self.loop.add_reader(self.exit_fd, self._sink.exited)
        if self._killed:  # killed while it was being forked
            child.kill()
        self.send(Start(VERSION, self._config, self._template))

    def launch_failed(self, why: str = "") -> None:
        """The process could not be started (``why``; empty: the runtime stops): it counts as
        one that exited at once."""
        if why:
            _log.error("cannot start a worker process: %s", why)
        self.child = Adopted(0, returncode=1)  # exited before it began
        self.loop.call_soon(self._sink.exited)

    # -- the socket ---------------------------------------------------------------------------

    def send(self, frame: Frame, fd: int | None = None) -> None:
        """Queue ``frame`` (and a duplicate of ``fd``): the frames of one loop iteration go out
        in one write, and the worker reads them in one."""
        if not self._batch:
            self.loop.call_soon(self._flush)
        elif fd is not None and len(self._batch_fds) == FDS_PER_WRITE:
            self._seal()  # what one write may carry
        self._batch.append(encode_frame(frame, has_fd=fd is not None))
        if fd is not None:
            self._batch_fds.append(os.dup(fd))  # the caller may close its own meanwhile

    def _seal(self) -> None:
        self._out.append((memoryview(b"".join(self._batch)), tuple(self._batch_fds)))
        self._batch.clear()
        self._batch_fds.clear()

    def _flush(self) -> None:
        if self._batch:
            self._seal()
        self._writable()
        if self._out:
            self.loop.add_writer(self._sock.fileno(), self._writable)

    def _writable(self) -> None:
        while self._out:
            data, fds = self._out[0]
            try:
                if fds:
                    rights = array.array("i", fds).tobytes()
                    sent = self._sock.sendmsg(
                        [data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)]
                    )
                else:
                    sent = self._sock.send(data)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # the process or its socket is gone (its exit is handled on its own)
                self._drop_output()
                break
            _close_all(fds)  # the kernel holds its own copies now
            if sent < len(data):
                self._out[0] = (data[sent:], ())
                return
            self._out.popleft()
        with contextlib.suppress(ValueError, OSError):
            self.loop.remove_writer(self._sock.fileno())

    def _drop_output(self) -> None:
        for _, fds in self._out:
            _close_all(fds)
        self._out.clear()

    def read_available(self) -> None:
        """Every frame the socket holds now (also what a process wrote just before it exited)."""
        while True:
            try:
                data, fds = receive(self._sock, self._into)
                frames = self._decoder.feed(data, fds)
            except (BlockingIOError, InterruptedError):
                return
            except ProtocolError as exc:  # nothing more it sends can be trusted
                _log.error(
                    "worker %s broke the protocol between it and the front (%s); a handler that "
                    "writes to a descriptor it did not open does this. The worker is killed and "
                    "replaced",
                    self.pid,
                    exc,
                )
                self.close_socket()
                self.kill()  # its exit fails the calls it was running, and starts a replacement
                return
            except OSError:
                data, frames = self._into[:0], []
            if not data:
                self.close_socket()
                return
            for frame, fd in frames:
                self._sink.received(frame, fd)
            if len(data) < len(self._into):  # all there was: no read that says "nothing more"
                return

    def close_socket(self) -> None:
        """The process finishes (it reads the end of its input), or a dead one is forgotten."""
        if self._sock.fileno() < 0:
            return
        self.loop.remove_reader(self._sock.fileno())
        self.loop.remove_writer(self._sock.fileno())
        self._drop_output()
        self._sock.close()
        self._decoder.close()

    # -- the process --------------------------------------------------------------------------

    def kill(self) -> None:
        if self.child is None:
            self._killed = True  # once it exists
        else:
            self.child.kill()  # (a process that has exited already is left alone)


def reap(process: HandlerProcess) -> int:
    """An exited process's exit code, what it wrote before it exited taken in."""
    if process.exit_fd is not None:
        process.loop.remove_reader(process.exit_fd)
        os.close(process.exit_fd)
        process.exit_fd = None
    with contextlib.suppress(OSError):
        process.read_available()
    process.close_socket()
    assert process.child is not None, "it exited, so it was started"
    return process.child.wait()


def device_environment(
    environment: dict[str, str], devices: str, held: list[str | None]
) -> dict[str, str]:
    """The environment of the next handler process: with ``devices`` (``--devices``), the one
    the fewest of the processes that stay hold (``held``; the first on a tie) as its
    :data:`DEVICE_VARIABLE`, so that a replacement gets its predecessor's device. A numeric id
    is a position among the devices the runtime was given itself (``abeja model run-local
    --gpus device=2,3``), as CUDA numbers them for it."""
    if not devices:
        return environment
    given = environment.get(DEVICE_VARIABLE, "")
    seen = given.split(",") if given else []
    candidates = [
        seen[int(device)] if device.isdigit() and int(device) < len(seen) else device
        for device in devices.split(",")
    ]
    device = min(candidates, key=held.count)
    return {**environment, DEVICE_VARIABLE: device}


def _close_all(fds: tuple[int, ...]) -> None:
    for fd in fds:
        os.close(fd)


def resident_memory(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return None


def backoff(deaths: int) -> float:
    """Seconds to wait before starting again a process that died ``deaths`` times in a row
    before it was ready (a worker, the template): none after the first, then 0.5 s, 1 s, 2 s,
    ... up to 30 s."""
    return 0.0 if deaths <= 1 else float(min(30.0, 0.5 * 2 ** (deaths - 2)))


def describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"
