"""``--log-format``: readable lines on a terminal, JSON lines otherwise; a busy port named as such
(issue 28 point 17).

A runtime started by hand writes to a terminal: here a pseudo-terminal (the ``pty`` module) is
its stdout and stderr, and a thread reads the other end. The test harness's own pipe is the
"otherwise" (``auto`` gives JSON there, which every other test relies on).
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers.servers import HANDLERS, START_TIMEOUT, RunningServer, runtime_env
from helpers.waiting import wait_until

from abeja_runtime.launch import RuntimeProcess, free_port, free_ports, runtime_command

#: ``2026-11-21 19:14:14.672``: a text line's local time.
STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}"
MAIN = HANDLERS / "lg_echo" / "main.py"
NOT_JSON = {"Content-Type": "application/json"}


def traceback_after(request_id: str) -> re.Pattern[str]:
    """The handler's error as a text log shows it: its line, then Python's traceback from the
    user's frame on, one line each."""
    return re.compile(
        rf"^{STAMP} ERROR   unexpected error occurred in the handler main:handler  "
        rf"request_id={request_id}\n"
        r"Traceback \(most recent call last\):\n"
        rf'  File "{re.escape(str(MAIN))}", line \d+, in handler\n'
        r"    body = json\.load\(request\)\n"
        r"(?:.*\n)*?"
        r"json\.decoder\.JSONDecodeError: Expecting value: line 1 column 1 \(char 0\)$",
        re.MULTILINE,
    )


def ids_of(request_id: str) -> dict[str, str]:
    return {"x-abeja-request-id": request_id}


def port_flags(port: int, healthcheck_port: int) -> tuple[str, ...]:
    return ("--port", str(port), "--healthcheck-port", str(healthcheck_port))


def printed(level: str, text: str, request_id: str) -> re.Pattern[str]:
    return re.compile(rf"^{STAMP} {level:<7} {re.escape(text)}  request_id={request_id}$", re.M)


def accessed(method: str, path: str, status: int, request_id: str) -> re.Pattern[str]:
    """An access record as a text log shows it: ``POST / 200 1.2 ms  request_id=...``."""
    return re.compile(
        rf"^{STAMP} INFO    {method} {re.escape(path)} {status} \d+\.\d ms  "
        rf"request_id={request_id}$",
        re.M,
    )


class TerminalRuntime:
    """A runtime whose stdout and stderr are a pseudo-terminal, as when started by hand."""

    def __init__(self, folder: str, *flags: str, tmp_path: Path) -> None:
        ports = free_ports(2)
        self._master, follower = pty.openpty()
        command = runtime_command("--host", "127.0.0.1", *port_flags(*ports), *flags)
        with open(follower, "wb", buffering=0) as terminal:  # the runtime keeps its own copy
            self.runtime = RuntimeProcess(
                command,
                cwd=HANDLERS / folder,
                env=runtime_env(TMPDIR=str(tmp_path)),
                output=terminal,
            )
        self.runtime.port, self.runtime.healthcheck_port = ports
        self.server = RunningServer(self.runtime, [], threading.Lock())  # for its requests
        self._read = bytearray()
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._follow, name="terminal", daemon=True)
        self._reader.start()

    def _follow(self) -> None:
        while True:
            try:
                chunk = os.read(self._master, 65536)
            except OSError:  # EIO: every process that had the terminal open has exited
                return
            if not chunk:
                return
            with self._lock:
                self._read += chunk

    def text(self) -> str:
        """What the terminal showed so far (its ``\\r\\n`` line ends as ``\\n``)."""
        with self._lock:
            shown = bytes(self._read)
        return shown.decode("utf-8", "replace").replace("\r\n", "\n")

    def wait_for(self, pattern: re.Pattern[str], timeout: float = 10.0) -> re.Match[str]:
        return wait_until(
            lambda: pattern.search(self.text()), timeout, f"{pattern.pattern!r} on the terminal"
        )

    def stop(self, timeout: float = 40.0) -> int:
        """SIGTERM, then the exit (bounded) and the last of its output."""
        self.runtime.popen.send_signal(signal.SIGTERM)
        code = self.runtime.popen.wait(timeout)
        self._reader.join(10)
        return code

    def close(self) -> None:
        self.runtime.kill()
        self._reader.join(10)  # the terminal's last holder is gone: the read ends
        os.close(self._master)


@pytest.fixture
def terminal_runtime(tmp_path: Path) -> Iterator[Callable[..., TerminalRuntime]]:
    """Start runtimes on a pseudo-terminal, healthy; every one is killed after the test."""
    started: list[TerminalRuntime] = []

    def start(folder: str, *flags: str) -> TerminalRuntime:
        terminal = TerminalRuntime(folder, *flags, tmp_path=tmp_path)
        started.append(terminal)
        try:
            terminal.runtime.wait_healthy(START_TIMEOUT)
        except Exception as exc:
            raise AssertionError(f"{exc}: {terminal.text()}") from None
        return terminal

    yield start
    for terminal in started:
        terminal.close()


def test_a_runtime_on_a_terminal_writes_readable_lines_and_real_tracebacks(terminal_runtime):
    terminal = terminal_runtime("lg_echo")
    server = terminal.server
    said = {"say": "hello from the handler", "warn": "careful"}
    assert server.post_json(said, headers=ids_of("tty-prints")).status == 200
    failed = server.request("POST", "/items?a=1", b"not json", {**NOT_JSON, **ids_of("tty-error")})
    assert failed.status == 500

    terminal.wait_for(traceback_after("tty-error"))  # the worker's record
    terminal.wait_for(printed("INFO", "hello from the handler", "tty-prints"))  # print()
    terminal.wait_for(printed("WARNING", "careful", "tty-prints"))  # print(file=sys.stderr)
    terminal.wait_for(accessed("POST", "/", 200, "tty-prints"))  # the front's access log
    terminal.wait_for(accessed("POST", "/items", 500, "tty-error"))
    port = server.port
    terminal.wait_for(
        re.compile(
            rf"^{STAMP} INFO    abeja-runtime \S+ serving main:handler from .* on "
            rf"http://127\.0\.0\.1:{port} .*  port={port} healthcheck_port=\d+$",
            re.M,
        )
    )
    assert terminal.stop() == 0
    shown = terminal.text()
    assert re.search(rf"^{STAMP} INFO    signal SIGTERM received; shutting down", shown, re.M)
    assert not [line for line in shown.splitlines() if line.startswith("{")], shown


def test_log_format_json_keeps_json_lines_on_a_terminal(terminal_runtime):
    terminal = terminal_runtime("lg_echo", "--log-format", "json")
    server = terminal.server
    failed = server.request("POST", "/", b"not json", {**NOT_JSON, **ids_of("tty-json")})
    assert failed.status == 500
    terminal.wait_for(re.compile(r'"http_status": 500'))
    assert terminal.stop() == 0
    records = [json.loads(line) for line in terminal.text().splitlines() if line]
    assert all(isinstance(record, dict) for record in records)
    error = next(r for r in records if r.get("traceback"))
    assert error["request_id"] == "tty-json"
    assert error["traceback"].startswith("Traceback (most recent call last):\n")


@pytest.mark.parametrize(
    ("flags", "env"),
    [(("--log-format", "text"), {}), ((), {"ABEJA_RUNTIME_LOG_FORMAT": "text"})],
    ids=["flag", "env"],
)
def test_log_format_text_writes_text_through_a_pipe(make_server, flags, env):
    ports = tuple(free_ports(2))
    server = make_server("lg_echo", *port_flags(*ports), *flags, env=env, ports=ports)
    said = server.post_json({"say": "piped", "warn": "piped warning"}, headers=ids_of("pipe-1"))
    assert said.status == 200, said.body
    failed = server.request("POST", "/", b"not json", {**NOT_JSON, **ids_of("pipe-2")})
    assert failed.status == 500

    def shown() -> str:
        return "\n".join(list(server.lines)) + "\n"

    for pattern in (
        traceback_after("pipe-2"),
        printed("INFO", "piped", "pipe-1"),
        printed("WARNING", "piped warning", "pipe-1"),
        accessed("POST", "/", 200, "pipe-1"),
        accessed("POST", "/", 500, "pipe-2"),
    ):
        wait_until(lambda p=pattern: p.search(shown()), 10, f"{pattern.pattern!r} in the log")
    assert server.stop() == 0
    assert not [line for line in server.lines if line.startswith("{")], server.lines


def test_a_batch_run_writes_text_logs_when_asked(tmp_path):
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "said.json").write_text('{"say": "from batch", "warn": "batch warning"}')
    (inputs / "broken.json").write_text("not json")
    done = subprocess.run(
        runtime_command("batch", str(inputs), "--output", str(tmp_path / "out")),
        cwd=HANDLERS / "lg_echo",
        env=runtime_env(ABEJA_RUNTIME_LOG_FORMAT="text"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stderr  # broken.json answers 500
    log = done.stderr
    assert re.search(rf"^{STAMP} INFO    from batch$", log, re.M), log
    assert re.search(
        rf"^{STAMP} INFO    POST said\.json 200 \d+\.\d ms  request_id=\S+$", log, re.M
    ), log
    assert re.search(rf"^{STAMP} INFO    POST broken\.json 500 \d+\.\d ms", log, re.M), log
    assert "\nTraceback (most recent call last):\n" in log
    assert not [line for line in log.splitlines() if line.startswith("{")], log


def test_an_unknown_log_format_is_a_usage_error():
    done = subprocess.run(
        runtime_command("--log-format", "yaml"),
        env=runtime_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "'yaml' is not one of 'auto', 'json', 'text'" in done.stderr, done.stderr


# --- a port in use --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "serving", "change"),
    [
        ("--port", "HTTP", "--port (PORT)"),
        ("--healthcheck-port", "health checks", "--healthcheck-port (HEALTHCHECK_PORT)"),
        ("--grpc-port", "gRPC", "--grpc-port (ABEJA_RUNTIME_GRPC_PORT)"),
    ],
)
def test_a_port_in_use_is_named_with_the_setting_that_changes_it(setting, serving, change):
    ports = {"--port": "0", "--healthcheck-port": "0"}
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        ports[setting] = str(port)
        done = subprocess.run(
            runtime_command("--host", "127.0.0.1", *(x for pair in ports.items() for x in pair)),
            cwd=HANDLERS / "ld_sync",
            env=runtime_env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 1, done
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(r["log_level"], r["message"]) for r in records] == [
        (
            "error",
            f"cannot listen for {serving} on 127.0.0.1:{port}: port {port} is in use by another "
            f"program; stop it or choose another with {change}",
        )
    ]
    assert done.stderr == ""


def test_a_port_in_use_on_a_terminal_is_one_readable_line(tmp_path):
    """As a person sees it: one line, no "failed to setup model", exit code 1."""
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        master, follower = pty.openpty()
        try:
            with open(follower, "wb", buffering=0) as terminal:
                runtime = subprocess.Popen(
                    runtime_command("--host", "127.0.0.1", *port_flags(port, free_port())),
                    cwd=HANDLERS / "ld_sync",
                    env=runtime_env(TMPDIR=str(tmp_path)),
                    stdin=subprocess.DEVNULL,
                    stdout=terminal,
                    stderr=terminal,
                )
            try:
                code = runtime.wait(60)
            finally:
                if runtime.poll() is None:
                    runtime.kill()
                    runtime.wait(10)
            shown = _drain(master)
        finally:
            os.close(master)
    assert code == 1
    assert re.fullmatch(
        rf"{STAMP} ERROR   cannot listen for HTTP on 127\.0\.0\.1:{port}: port {port} is in use "
        rf"by another program; stop it or choose another with --port \(PORT\)\n",
        shown,
    ), shown


def _drain(master: int) -> str:
    """What a terminal whose every writer has exited showed (read until EIO, or until nothing
    came for 10 s)."""
    shown = bytearray()
    while select.select([master], [], [], 10)[0]:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        shown += chunk
    return shown.decode("utf-8", "replace").replace("\r\n", "\n")
