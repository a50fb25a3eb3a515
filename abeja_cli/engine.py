"""What both engines share: the run description and the running-server interface.

An engine (``docker_engine.DockerEngine`` or ``local_engine.LocalEngine``) has three verbs:
``prepare(spec)`` (build or check what is needed; may take long), ``serve(spec, sink)``, a
context manager yielding a :class:`Server` that is stopped and removed on every way out, and
``run_batch(spec, batch, sink, answer)``, which runs ``abeja-runtime batch`` to its end and
returns its exit code.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Final, Protocol

from abeja_runtime.config import Config

if TYPE_CHECKING:
    from abeja_cli.gpus import GpuRequest
    from abeja_cli.server_log import LogSink

__all__ = ["SERVICE_PORT", "BatchSpec", "Engine", "RunSpec", "Server"]

#: Port of the runtime inside a container (the platform's; ``PORT`` default of the runtime).
SERVICE_PORT: Final = Config.port


@dataclass(frozen=True)
class RunSpec:
    """Everything an engine needs to run one project."""

    project: Path
    handler: str
    env: Mapping[str, str]
    image: str = "python:3.11-slim"
    device_type: str = "x86_cpu"
    #: ``--gpus``; None: none beyond what ``device_type`` gives.
    gpus: GpuRequest | None = None
    host_port: int | None = None
    no_cache: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)
    #: Local engine: pass the user's whole shell environment, not only a minimal part of it.
    inherit_env: bool = False
    #: The variable that chose ``image`` (ABEJA_IMAGE, or that of .env; "" for -i and the
    #: default), named in messages about it.
    image_origin: str = ""


@dataclass(frozen=True)
class BatchSpec:
    """An ``abeja-runtime batch`` run: input files and folders, and the folder for their
    answers, on this machine; no inputs means the one input of ``INPUT`` (``-e INPUT=...``)."""

    inputs: tuple[Path, ...] = ()
    output: Path | None = None

    def arguments(self, inputs: list[str], output: str | None) -> list[str]:
        """The runtime's arguments, with the paths as the process running it sees them."""
        return ["batch", *inputs, *(["--output", output] if output is not None else [])]


class Server(ABC):
    """A running model server, reachable at :attr:`url` on the loopback interface."""

    url: str
    #: One line saying what runs (shown in the run-local-server banner).
    description: str
    #: The thread passing the server's output to the log sink, once started.
    log_thread: threading.Thread | None = None

    @abstractmethod
    def exit_code(self) -> int | None:
        """None while the server runs, else the exit status of its process."""

    def drain_logs(self, timeout: float = 2.0) -> None:
        """Wait (bounded) until the log reader has passed on everything the server wrote."""
        if self.log_thread is not None:
            self.log_thread.join(timeout)

    @abstractmethod
    def reload(self) -> None:
        """Have the runtime load the project's code anew (SIGHUP, ``--reload``): it serves the
        version it has until the new one is ready, and goes on with it if the new one fails."""

    @abstractmethod
    def stop(self) -> None:
        """Stop gracefully (SIGTERM, then kill after a grace period)."""


class Engine(Protocol):
    """The interface both engines implement."""

    name: str

    def prepare(self, spec: RunSpec) -> None: ...

    def serve(self, spec: RunSpec, sink: LogSink) -> AbstractContextManager[Server]: ...

    def run_batch(self, spec: RunSpec, batch: BatchSpec, sink: LogSink, answer: BinaryIO) -> int:
        """Run the batch to its end: its log (stderr) to ``sink``, its stdout (the answer to
        ``INPUT``) to ``answer``; returns its exit code. Nothing is left running."""
        ...
