"""The template (``abeja-template`` in ``ps -o comm``): a process that imports the handler once
and serves nothing. Every handler process is forked from it, so that the pages of a loaded model
are shared copy-on-write, and a replacement is ready in the time of a fork and its warm-up
(gunicorn's ``--preload``, Android's zygote).

It loads the handler, says :class:`~abeja_runtime.frames.Loaded` (with what would make a fork
unsafe: :func:`fork_hazard`), then, for each :class:`~abeja_runtime.frames.Fork` and the
descriptor of the new process's socket, forks twice: the middle process exits at once, so that
the front (a child subreaper) adopts the handler process, whose pid the template answers
(:class:`~abeja_runtime.frames.Forked`). The front closing the socket ends the template; the
processes forked from it live on.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import gc
import logging
import os
import select
import socket
import threading
import time
from pathlib import Path
from typing import Final, NoReturn

from abeja_runtime.config import Config
from abeja_runtime.frames import BlockingChannel, Fork, Forked, Loaded, LoadFailed
from abeja_runtime.tracing import Tracing, tracing_from
from abeja_runtime.worker.process import (
    WORKER_NAME,
    ImportedHandler,
    WorkerChannel,
    end,
    load,
    name_this_process,
    obey,
    serve,
    start_frame,
)

__all__ = ["fork_hazard", "serve_template"]

_log = logging.getLogger("abeja_runtime")
#: Seconds a forked process waits for the middle process to exit (it exits at once).
_ADOPTION_WAIT: Final = 10.0


def serve_template(channel: BlockingChannel, config: Config, front: int) -> int:
    """Load the handler, then fork handler processes as the front asks: the exit code."""
    name_this_process(b"abeja-template")
    # Before the handler is imported: its own tracer provider is this one.
    tracing = tracing_from(os.environ, "worker")
    threads = {thread.ident for thread in threading.enumerate()}
    tasks, sockets = _tasks(), _sockets()
    loaded = load(config)
    if isinstance(loaded, LoadFailed):
        channel.write(loaded)
        return 1
    hazard = fork_hazard(threads, tasks, sockets)
    channel.write(Loaded(hazard))
    if hazard:
        return 0
    # The collector's bookkeeping does not write to the pages the forks share. No collection
    # first: of a big model's objects it takes as long as the rest of a fork (60 ms for a
    # scikit-learn forest), for the little garbage an import leaves.
    gc.freeze()
    forks = _Forks(loaded, tracing, front, channel)
    while (item := channel.read()) is not None:
        frame, fd = item
        if isinstance(frame, Fork) and fd is not None:
            forked = forks.fork(frame, fd)
            try:
                channel.write(forked)
            except OSError:  # the front stopped meanwhile: the process reads the end of its input
                return 0
        elif fd is not None:
            os.close(fd)
    return 0


#: Libraries whose thread pools do not survive a fork (the forked process waits for threads it
#: does not have), named in the warning when their threads may be the ones started.
_POOLS_LOST_IN_A_FORK: Final = {
    "/libgomp": "OpenMP (libgomp)",
    "/libiomp": "OpenMP (libiomp)",
    "tensorflow": "TensorFlow",
    "onnxruntime": "ONNX Runtime",
    "/libtorch": "PyTorch",
}
#: How OpenBLAS says how many threads its pool has, by the names its builds give it (numpy's
#: and scipy's wheels: ``scipy_openblas``).
_OPENBLAS_THREADS: Final = (
    "openblas_get_num_threads",
    "openblas_get_num_threads64_",
    "scipy_openblas_get_num_threads64_",
    "scipy_openblas_get_num_threads",
)


def fork_hazard(threads: set[int | None], tasks: set[str], sockets: set[int]) -> str:
    """Why a process forked from this one would not work (empty: it would), given the Python
    threads, the system's threads and the sockets of this process from before the handler's
    import.

    A thread the import started is not in a forked process, and what waits for it there hangs;
    OpenBLAS's pool (numpy's) is the exception: it stops its threads before a fork and starts
    them again after (``pthread_atfork``). A socket the import opened (a database's connection,
    a client's) would be shared by every forked process, their messages mixed on it."""
    started = [thread.name for thread in threading.enumerate() if thread.ident not in threads]
    if started:
        return (
            f"the handler's import started {len(started)} Python thread(s) "
            f"({', '.join(started)}), which a forked process would not have"
        )
    opened = len(_sockets() - sockets)
    if opened:
        return (
            f"the handler's import opened {opened} socket(s) (a connection, a client), which "
            "the forked processes would share"
        )
    maps = _maps()
    if "/libcuda.so" in maps:
        return "the handler's import initialised CUDA, which a forked process cannot use"
    native = len(_tasks() - tasks) - _openblas_pool(maps)
    if native > 0:
        pools = [name for library, name in _POOLS_LOST_IN_A_FORK.items() if library in maps]
        return (
            f"the handler's import started {native} thread(s) of a native library"
            f"{' (' + ', '.join(pools) + ' loaded)' if pools else ''}, which a forked process "
            "would not have"
        )
    return ""


def _openblas_pool(maps: str) -> int:
    """The threads that the OpenBLAS pools loaded in this process started (its size less the
    calling thread)."""
    paths = {line.split()[-1] for line in maps.splitlines() if "openblas" in line}
    count = 0
    for path in paths:
        with contextlib.suppress(OSError):
            library = ctypes.CDLL(path)  # loaded already: the same handle
            size = next(
                (getattr(library, name) for name in _OPENBLAS_THREADS if hasattr(library, name)),
                None,
            )
            if size is not None:
                count += max(0, int(size()) - 1)
    return count


@dataclasses.dataclass(frozen=True)
class _Forks:
    """The handler processes forked from this template: what each one starts from."""

    loaded: ImportedHandler
    tracing: Tracing | None
    #: The front's pid: a forked process is adopted by it, and dies with it.
    front: int
    #: The template's channel with the front (not a forked process's).
    template: BlockingChannel

    def fork(self, fork: Fork, fd: int) -> Forked:
        """Fork a handler process that serves on ``fd``, through a middle process that exits
        at once (so that the front adopts it): its pid."""
        read_end, write_end = os.pipe()
        forked_at = time.monotonic()
        try:
            middle = os.fork()
        except OSError as exc:
            for end_fd in (read_end, write_end, fd):
                os.close(end_fd)
            return Forked(0, f"the template could not fork: {exc}")
        if middle == 0:
            try:
                os.close(read_end)
                pid = os.fork()
                if pid == 0:
                    os.close(write_end)
                    self._handler_process(fork, fd, forked_at)
                os.write(write_end, pid.to_bytes(4, "little"))
            except BaseException:
                _log.exception("the template could not fork a handler process")
            finally:
                os._exit(0)
        os.close(write_end)
        os.close(fd)
        os.waitpid(middle, 0)
        with open(read_end, "rb") as pid_from_middle:
            said = pid_from_middle.read()
        if len(said) != 4:
            return Forked(0, "the template could not fork a handler process (its log says why)")
        return Forked(int.from_bytes(said, "little"), "")

    def _handler_process(self, fork: Fork, fd: int, forked_at: float) -> NoReturn:
        """The forked handler process, from its fork to its exit."""
        code, tracing = 1, self.tracing
        try:
            self.template.close_pending()
            # Its channel takes the descriptor of the template's (not this process's): the
            # number its command line says, as in a process started afresh.
            channel = self.template.detach()
            os.dup2(fd, channel, inheritable=False)
            os.close(fd)
            _wait_for_adoption(self.front)
            obey(self.front)
            name_this_process(WORKER_NAME)
            os.environ.update(fork.environment)
            worker = WorkerChannel(socket.socket(fileno=channel))
            start_frame(worker.channel)
            loaded = dataclasses.replace(self.loaded, forked_at=forked_at)
            code = serve(loaded, worker, tracing)
        except BaseException:  # (SystemExit too: this process ends here, not in the template)
            _log.exception("the worker failed")
        end(code, tracing)


def _wait_for_adoption(front: int) -> None:
    """Until the middle process has exited, and this one is the front's (bounded)."""
    parent = os.getppid()
    if parent == front:
        return
    with contextlib.suppress(OSError):
        exited = os.pidfd_open(parent)
        try:
            select.select([exited], [], [], _ADOPTION_WAIT)  # readable once it has exited
        finally:
            os.close(exited)


def _tasks() -> set[str]:
    with contextlib.suppress(OSError):
        return set(os.listdir("/proc/self/task"))
    return set()


def _sockets() -> set[int]:
    found = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                    found.add(int(fd))
    return found


def _maps() -> str:
    with contextlib.suppress(OSError):
        return Path("/proc/self/maps").read_text()
    return ""
