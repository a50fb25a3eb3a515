"""The local engine: ``abeja-runtime`` as a subprocess of the current Python, no Docker.

For a fast edit-run loop and for machines without Docker. The model runs with this Python, or,
when the project has a ``requirements.txt`` or ``Pipfile``, in a virtual environment with them
installed (``venvs.py``), with the project folder as its working directory, listening on
127.0.0.1 only. It sees the machine's GPUs, whatever they are; ``--gpus`` gives it the ids a
container would get (:attr:`~abeja_cli.gpus.GpuRequest.visible_devices`), and says which of
them the machine has.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import BinaryIO, Final

from abeja_cli.console import Console
from abeja_cli.engine import BatchSpec, RunSpec, Server
from abeja_cli.environment import local_environment
from abeja_cli.errors import EngineUnavailable, InputError, ServerError
from abeja_cli.gpus import GpuRequest, MachineGpus, machine_gpus
from abeja_cli.server_log import LogSink, pump_lines, start_daemon
from abeja_cli.venvs import project_python
from abeja_runtime.launch import RuntimeProcess, free_port, runtime_command

__all__ = ["LocalEngine", "LocalServer", "free_port"]

#: Seconds a stopping runtime gets to finish in-flight requests before it is killed.
_GRACE: Final = 10.0
_CUDA: Final = "CUDA_VISIBLE_DEVICES"


class LocalServer(Server):
    """One ``python -m abeja_runtime`` process."""

    def __init__(self, spec: RunSpec, sink: LogSink, python: str = sys.executable) -> None:
        self._spec = spec
        self._sink = sink
        self._python = python
        self.port = spec.host_port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.description = f"local engine ({python})"
        self._runtime: RuntimeProcess | None = None

    def command(self) -> list[str]:
        return runtime_command(
            "--handler",
            self._spec.handler,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            # The kernel's choice, named in the start-up record: a port picked here and bound
            # by the runtime a moment later was sometimes taken meanwhile (by a test running
            # beside it), and the start failed.
            "--healthcheck-port",
            "0",
            python=self._python,
        )

    def start(self) -> None:
        env = local_environment(os.environ, _model_env(self._spec), inherit=self._spec.inherit_env)
        # The flags win anyway; drop these so a stray PORT in the user's shell is not confusing.
        for name in ("PORT", "HEALTHCHECK_PORT"):
            env.pop(name, None)
        try:
            self._runtime = RuntimeProcess(
                self.command(),
                cwd=self._spec.project,
                env=env,
                on_line=self._sink,
                # A CLI killed outright (kill -9, a crashed terminal) takes the runtime along.
                preexec_fn=_end_with_parent(),
            )
        except OSError as exc:
            raise ServerError(f"cannot start {self._python}: {exc}") from None
        self.log_thread = self._runtime.reader

    def exit_code(self) -> int | None:
        return None if self._runtime is None else self._runtime.exit_code()

    def stop(self) -> None:
        runtime, self._runtime = self._runtime, None
        if runtime is not None:
            runtime.stop(_GRACE)

    def reload(self) -> None:
        if self._runtime is not None:
            with contextlib.suppress(ProcessLookupError):  # it exited: the CLI says so next
                os.kill(self._runtime.pid, signal.SIGHUP)

    def discard(self) -> None:
        """Kill at once whatever still runs (also after a Ctrl+C during a graceful stop)."""
        runtime, self._runtime = self._runtime, None
        if runtime is not None:
            runtime.kill()


def _given_gpus(gpus: GpuRequest, env: Mapping[str, str], machine: MachineGpus) -> tuple[str, bool]:
    """What the model gets of ``--gpus`` on this machine, in one line, and whether that is
    all it asked for (else the line is a warning); :class:`InputError` when the model's
    variables choose GPUs too (in a container, they would choose among those of ``--gpus``,
    numbered from 0: the local engine cannot show that)."""
    visible = gpus.visible_devices
    if visible is None:
        said = f"--gpus {gpus.text}: the model sees every GPU of this machine"
        if machine.uuids:
            return f"{said}, which has {machine.described()}", True
        return f"{said}, but it has {machine.described()}, so the model runs without one", False
    if _CUDA in env:
        raise InputError(
            f"--gpus {gpus.text} and {_CUDA}={env[_CUDA]} (-e or --env-file) both choose the "
            f"model's GPUs; with the local engine give one of them"
        )
    given = f"--gpus {gpus.text}: the model is given {_CUDA}={visible}"
    if not machine.uuids:
        return f"{given}, but this machine has {machine.described()}, so it runs without one", False
    missing = [device for device in visible.split(",") if not machine.has(device)]
    if missing:
        return (
            f"{given}, but this machine has {machine.described()} and no {','.join(missing)}, "
            "so the model gets fewer GPUs than asked",
            False,
        )
    return f"{given}, and this machine has {machine.described()}", True


def _model_env(spec: RunSpec) -> Mapping[str, str]:
    """The model's variables, with the GPUs of ``--gpus``."""
    visible = spec.gpus.visible_devices if spec.gpus is not None else None
    return spec.env if visible is None else {**spec.env, _CUDA: visible}


def _end_with_parent() -> Callable[[], None] | None:
    """For ``preexec_fn``: SIGTERM the child when the CLI dies, however it dies (Linux).

    ``prctl`` is looked up here, in the parent: the child, between fork and exec, must not
    import anything (another thread may hold the import lock). Elsewhere nothing is set; the
    CLI still stops the runtime on every way out that it sees.
    """
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    pr_set_pdeathsig = 1
    return lambda: prctl(pr_set_pdeathsig, signal.SIGTERM)


class LocalEngine:
    """Runs the runtime in this Python environment."""

    name = "local"

    def __init__(self, console: Console) -> None:
        self._console = console
        self._python: str | None = None

    def prepare(self, spec: RunSpec) -> None:
        self._console.info(f"using the local engine : {sys.executable}")
        if spec.gpus is not None:
            line, enough = _given_gpus(spec.gpus, spec.env, machine_gpus())
            (self._console.info if enough else self._console.warning)(line)
        if importlib.util.find_spec("abeja_runtime") is None:
            raise EngineUnavailable(
                f"the abeja-runtime package is not installed in {sys.executable}; install it "
                "there (pip install abeja-runtime) or use the Docker engine"
            )
        self._python = project_python(spec.project, self._console)

    def run_batch(self, spec: RunSpec, batch: BatchSpec, sink: LogSink, answer: BinaryIO) -> int:
        if self._python is None:
            self.prepare(spec)
        arguments = batch.arguments(
            [str(path) for path in batch.inputs],
            str(batch.output) if batch.output is not None else None,
        )
        try:
            process = subprocess.Popen(
                runtime_command(*arguments, python=self._python or sys.executable),
                cwd=spec.project,
                env=local_environment(os.environ, spec.env, inherit=spec.inherit_env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                preexec_fn=_end_with_parent(),
            )
        except OSError as exc:
            raise ServerError(f"cannot start {self._python}: {exc}") from None
        assert process.stdout is not None and process.stderr is not None
        errors = process.stderr
        log = start_daemon(lambda: pump_lines(iter(errors), sink), "batch-log")
        try:
            shutil.copyfileobj(process.stdout, answer)
            code = process.wait()
        finally:
            if process.poll() is None:  # interrupted: nothing is left running
                process.kill()
                process.wait()
            log.join(_GRACE)
            process.stdout.close()
            process.stderr.close()
        return code

    @contextmanager
    def serve(self, spec: RunSpec, sink: LogSink) -> Iterator[Server]:
        if self._python is None:
            self.prepare(spec)
        server = LocalServer(spec, sink, self._python or sys.executable)
        try:
            server.start()
            yield server
            server.stop()  # gracefully: the model's last log lines (its access record) arrive
        finally:
            server.discard()
