"""The servers under test: the runtime and the bare aiohttp app, started and stopped alike.

Both are started through :mod:`abeja_runtime.launch` (the runtime's one way to start a server
subprocess and wait for its health check): a session of their own, output to a log file, a
bounded wait for ``/health_check``, and a stop that reports any process of the group still
running after the main one exited, then kills the group.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

from abeja_runtime.launch import NotHealthy, RuntimeProcess, free_port, free_ports
from benchmarks.processes import proc_table

__all__ = [
    "DEFAULT_TARGETS",
    "TARGETS",
    "Server",
    "ServerError",
    "Setup",
    "post",
    "running",
    "runtime_source",
    "server_for",
]

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
HANDLERS = BENCH / "handlers"
#: What can be measured: the runtime, and the bare app on each event loop.
#: ``runtime-traced``: the runtime with every request traced, its spans sent over OTLP/HTTP to
#: a sink (``otlp_sink.py``) that keeps nothing; ``runtime-sampled``: the same with one request
#: in ten traced (``parentbased_traceidratio``), as a busy service would sample.
#: ``runtime-baseline``: the runtime as of ``--baseline-ref``, to hold a change against.
TARGETS = (
    "bare",
    "bare-uvloop",
    "runtime",
    "runtime-traced",
    "runtime-sampled",
    "runtime-baseline",
)
#: What a run measures unless ``--targets`` says otherwise.
DEFAULT_TARGETS = ("bare", "bare-uvloop", "runtime", "runtime-traced")
#: The tracing variables of the traced targets, beside the sink's endpoint.
_TRACED: Final = {
    "runtime-traced": {},
    "runtime-sampled": {
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.1",
    },
}
#: Seconds a server's helpers may take to exit after its main process.
LEFTOVER_GRACE = 3.0
#: Keep BLAS single-threaded in both servers: with 2 cores shared with wrk, a multi-threaded
#: matmul would only add contention and make numpy_1ms numbers depend on thread scheduling.
SERVER_ENV = {
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "PYTHONUNBUFFERED": "1",
    # Nothing balances in front of a benchmark's server: its stop need not wait for one.
    "ABEJA_RUNTIME_DRAIN_DELAY": "0",
}


class ServerError(RuntimeError):
    """The server did not start, answered wrongly, or could not be stopped."""


@dataclass(frozen=True)
class Setup:
    """Everything that shapes how servers are started."""

    runtime_src: Path  # put first on the runtime's PYTHONPATH
    runtime_src_desc: str
    runtime_args: list[str]
    pin: str
    ready_timeout: float
    stop_timeout: float
    tmp: Path
    #: Where ``runtime-traced`` sends its spans (``otlp_sink.py``).
    otlp_endpoint: str = ""
    #: Where ``runtime-baseline`` imports the runtime from (``--baseline-ref``).
    baseline_src: Path | None = None


@dataclass
class Server:
    """One server subprocess; its output goes to ``log``, never to our terminal."""

    target: str
    command: list[str]
    cwd: Path
    env: dict[str, str]
    log: Path
    port: int
    healthcheck_port: int
    process: RuntimeProcess | None = None
    ready_s: float = 0.0
    leftovers: list[int] = field(default_factory=list)
    _log_file: IO[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None, "the server was not started"
        return self.process.pid

    def start(self) -> None:
        # Straight into the file: a thread that relayed each line (a write per line) competed
        # with the servers for the same two cores, and the runtime logs a line per request.
        self._log_file = self.log.open("wb")
        self.process = RuntimeProcess(
            self.command, cwd=self.cwd, env=self.env, output=self._log_file
        )
        self.process.port, self.process.healthcheck_port = self.port, self.healthcheck_port

    def wait_ready(self, timeout: float) -> float:
        """Seconds until ``/health_check`` said 200; :class:`ServerError` with the log if not."""
        assert self.process is not None
        try:
            self.ready_s = self.process.wait_healthy(timeout)
        except NotHealthy as exc:
            raise ServerError(f"{self.target}: {exc}:\n{tail(self.log)}") from None
        return self.ready_s

    def stop(self, timeout: float) -> None:
        """SIGTERM, up to ``timeout`` to exit; what of its group still runs after that (and
        ``LEFTOVER_GRACE``) is recorded in ``leftovers``; then the group is killed."""
        if self.process is None:
            return
        popen = self.process.popen
        terminate(popen, self.target, timeout)
        self.leftovers = _group_still_running(popen.pid, LEFTOVER_GRACE)
        if self.leftovers:
            print(f"  ! {self.target} left processes {self.leftovers} behind", file=sys.stderr)
        self.process.kill()
        if self._log_file is not None:
            self._log_file.close()


def terminate(popen: subprocess.Popen[Any], name: str, timeout: float) -> None:
    """SIGTERM to a server still running, and up to ``timeout`` seconds for it to exit (said
    when it did not)."""
    if popen.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        popen.send_signal(signal.SIGTERM)
    try:
        popen.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"  ! {name} ignored SIGTERM for {timeout:.0f}s", file=sys.stderr)


def _group_still_running(pgid: int, grace: float) -> list[int]:
    """Processes of group ``pgid`` (zombies aside) still there after ``grace`` seconds."""
    deadline = time.monotonic() + grace
    while True:
        alive = [
            pid for pid, info in proc_table().items() if info.pgrp == pgid and info.state != "Z"
        ]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.1)


def split_cores(pin: str, workers: int) -> bool:
    """Whether to put the server on CPU 0 and wrk on CPU 1 for this row.

    With one worker, splitting gives both targets the same single core and keeps wrk from
    stealing it; with more workers than one core, splitting would serialise the workers.
    """
    return pin == "split" or (pin == "auto" and workers == 1)


def tail(path: Path, n: int = 25) -> str:
    """Last lines of a server log, for error messages."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-n:]) or "(empty log)"


def server_for(
    setup: Setup, target: str, workers: int, handler_dir: str, extra: list[str] | None = None
) -> Server:
    """Build (not start) the server of ``target``."""
    port, hc_port = free_ports(2)
    while hc_port == port:
        hc_port = free_port()
    common = ["--host", "127.0.0.1", "--port", str(port), "--healthcheck-port", str(hc_port)]
    common += ["--workers", str(workers)]
    env = {**os.environ, **SERVER_ENV}
    if target in ("bare", "bare-uvloop"):
        loop = "uvloop" if target == "bare-uvloop" else "asyncio"
        command = [sys.executable, str(BENCH / "bare_app.py"), *common, "--loop", loop]
        cwd = BENCH
    else:
        command = [sys.executable, "-m", "abeja_runtime", "--handler", "main:handler", *common]
        command += setup.runtime_args
        cwd = HANDLERS / handler_dir
        if target in _TRACED:
            env.update(_TRACED[target], OTEL_EXPORTER_OTLP_ENDPOINT=setup.otlp_endpoint)
        # Test this checkout (or --runtime-ref), not whatever copy is installed elsewhere.
        baseline = setup.baseline_src if target == "runtime-baseline" else None
        src = str(baseline or setup.runtime_src)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    command += extra or []
    if split_cores(setup.pin, workers):
        command = ["taskset", "-c", "0", *command]
    log = setup.tmp / f"{target}-w{workers}-{handler_dir}-{port}.log"
    return Server(target, command, cwd, env, log, port, hc_port)


def runtime_source(ref: str, tmp: Path) -> tuple[Path, str]:
    """Where the runtime is imported from: the working tree, or ``ref`` exported read-only.

    ``git archive`` leaves the repository untouched (no worktree, no checkout).
    """
    if not ref:
        return REPO, f"working tree {REPO}"
    sha = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", f"{ref}^{{commit}}"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.strip()
    dest = tmp / "runtime-src"
    dest.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", sha, "abeja_runtime"],
        capture_output=True,
        timeout=60,
        check=True,
    )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return dest, f"git {ref} = {sha[:12]} (exported with git archive)"


@contextlib.contextmanager
def running(server: Server, setup: Setup) -> Iterator[Server]:
    """Start and wait for ``server``; stop it on every exit path."""
    try:
        server.start()
        server.wait_ready(setup.ready_timeout)
        yield server
    finally:
        server.stop(setup.stop_timeout)


def post(
    port: int,
    path: str,
    content_type: str,
    body: bytes | Iterable[bytes],
    timeout: float = 30,
    *,
    length: int | None = None,
) -> Any:
    """One POST returning parsed JSON; raises ServerError on a non-200 or non-JSON answer.

    An iterable body is sent as it comes: with ``length`` as its Content-Length, else chunked.
    """
    headers = {"Content-Type": content_type}
    if length is not None:
        headers["Content-Length"] = str(length)
    chunked = not isinstance(body, bytes) and length is None
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        # If the server answers early (e.g. 413) the write fails; the response says why.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            conn.request("POST", path, body=body, headers=headers, encode_chunked=chunked)
        resp = conn.getresponse()
        data = resp.read()
    finally:
        conn.close()
    if resp.status != 200:
        raise ServerError(f"POST {path} -> {resp.status}: {data[:300]!r}")
    try:
        return json.loads(data)
    except ValueError as e:
        raise ServerError(f"POST {path} -> non-JSON body {data[:300]!r}") from e
