"""Bad options and inputs: one ``[error]`` line, exit 2, and nothing built or started.

These run with the default engine (Docker when reachable), so a check that came after the
build would be caught: the project must have no image and no container afterwards.
"""

from __future__ import annotations

import contextlib
import os
import pty
import select
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.cli import Result, ours

CASES = [
    (["--input", "missing.json"], "input file not found: missing.json"),
    (["--input", "folder"], "input file folder is a directory; --input needs a file"),
    (["--input", "broken.json"], "input file broken.json is not valid JSON (Expecting"),
    (["--input", "f=@broken.json"], "input file broken.json is not valid JSON"),
    (["--input", "request.json", "-e", "NOVALUE"], "-e 'NOVALUE' has no value"),
    (["--input", "request.json", "-e", "9X=1"], "'9X' is not a valid variable name"),
    (["--input", "request.json", "--env-file", "nope.env"], "--env-file nope.env does not exist"),
    (["--input", "request.json", "-h", "main.handler"], "-h 'main.handler' is not MODULE:FUNCTION"),
    (["--input", "request.json", "--output", "no/such/dir/x"], "the folder no/such/dir does not"),
    (["--input", "request.json", "--input", "main.py"], "only one body file can be sent"),
    ([], "missing --input"),
    (["--input", "request.json", "-o", "answer.jpg"], "-o is the organization id, as on ABEJA"),
]


@pytest.mark.parametrize(("args", "message"), CASES, ids=[m[:30] for _, m in CASES])
def test_bad_input_is_one_line_and_exit_2(
    abeja: Callable[..., Result], project: Callable[[str], Path], args: list[str], message: str
) -> None:
    cwd = project("responder")
    (cwd / "broken.json").write_text('{"a": 1,}')
    (cwd / "folder").mkdir()
    handler = [] if "-h" in args else ["-h", "main:echo"]
    result = abeja("model", "run-local", *handler, *args, cwd=cwd)
    assert result.returncode == 2, str(result)
    assert result.stdout == b""
    assert len(result.stderr.splitlines()) == 1, result
    assert result.stderr.startswith("[error] ") and message in result.stderr, result
    _assert_nothing_made(cwd)


@pytest.mark.parametrize(
    "command",
    [
        ("model", "manifests", "--image", "m:1", "--target", "kubernetes"),
        ("model", "run-batch", "-h", "main:echo"),
    ],
)
def test_o_means_the_organization_id_in_every_command(
    abeja: Callable[..., Result], project: Callable[[str], Path], command: tuple[str, ...]
) -> None:
    """No command takes -o for its output file (--output does that everywhere)."""
    cwd = project("responder")
    result = abeja(*command, "-o", "out.yaml", "request.json", cwd=cwd)
    assert result.returncode == 2, str(result)
    assert "-o is the organization id" in result.stderr or "No such option '-o'" in result.stderr
    assert not (cwd / "out.yaml").exists()


def test_clean_all_asks_first(abeja: Callable[..., Result], tmp_path: Path) -> None:
    """Off a terminal --all needs --yes; on one, it asks, and "no" removes nothing."""
    refused = abeja("model", "clean", "--all", cwd=tmp_path)
    assert refused.returncode == 2, str(refused)
    assert refused.stderr.startswith("[error] clean --all removes every project's"), refused
    assert "add --yes to confirm" in refused.stderr

    pid, terminal = pty.fork()
    if pid == 0:  # the child: the CLI on a terminal
        os.chdir(tmp_path)
        os.execv(sys.executable, [sys.executable, "-m", "abeja_cli", "model", "clean", "--all"])
    seen = b""
    with open(terminal, "r+b", buffering=0) as tty:
        while b"[y/N]" not in seen:
            ready, _, _ = select.select([tty], [], [], 30)
            assert ready, f"no question within 30 s: {seen!r}"
            seen += os.read(terminal, 1024)
        tty.write(b"n\n")
        with contextlib.suppress(OSError):  # EIO once the child has closed the terminal
            while chunk := os.read(terminal, 1024):
                seen += chunk
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 1, seen
    assert b"nothing was removed" in seen, seen


def test_server_port_in_use(abeja: Callable[..., Result], project: Callable[[str], Path]) -> None:
    import socket

    cwd = project("responder")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = abeja("model", "run-local-server", "-h", "main:echo", "-p", str(port), cwd=cwd)
    assert result.returncode == 2, str(result)
    assert result.stderr == (
        f"[error] port {port} on 127.0.0.1 is already in use; choose another with -p\n"
    )
    _assert_nothing_made(cwd)


def test_click_usage_errors_exit_2(abeja: Callable[..., Result], tmp_path: Path) -> None:
    missing = abeja("model", "run-local", "--input", "x.json", cwd=tmp_path)
    assert missing.returncode == 2
    assert "Missing option '-h' / '--handler'" in missing.stderr
    device = abeja("model", "run-local", "-h", "m:f", "-d", "tpu", cwd=tmp_path)
    assert device.returncode == 2
    assert "'tpu' is not one of 'x86_cpu', 'x86_gpu', 'jetson_tx2', 'raspberry3'" in device.stderr


@pytest.mark.parametrize("command", ["run-local", "run-local-server"])
@pytest.mark.parametrize(
    "gpus", ["0", "two", "device=", "device=0;1", "device=abc", "device=0,", "count=0", "driver=x"]
)
def test_a_bad_gpu_request_is_a_usage_error(
    abeja: Callable[..., Result], project: Callable[[str], Path], command: str, gpus: str
) -> None:
    cwd = project("responder")
    result = abeja("model", command, "-h", "main:echo", "--gpus", gpus, cwd=cwd)
    assert result.returncode == 2, str(result)
    assert (
        f"Invalid value for '--gpus': {gpus!r} is not a GPU request; write all, a count (2: the "
        "first two), or device=0,1, as docker run --gpus takes them"
    ) in result.stderr, str(result)
    _assert_nothing_made(cwd)


@pytest.mark.parametrize(
    "command",
    [(), ("model",), ("model", "clean"), ("model", "init"), ("model", "manifests")],
    ids=["abeja", "model", "clean", "init", "manifests"],
)
def test_h_is_help_where_it_is_not_the_handler(
    abeja: Callable[..., Result], tmp_path: Path, command: tuple[str, ...]
) -> None:
    short = abeja(*command, "-h", cwd=tmp_path)
    assert short.returncode == 0, str(short)
    assert short.text.startswith(f"Usage: {' '.join(('abeja', *command))} [OPTIONS]"), short
    assert short.text == abeja(*command, "--help", cwd=tmp_path).text
    assert list(tmp_path.iterdir()) == []  # init -h made no project


@pytest.mark.parametrize("command", ["run-local", "run-local-server", "run-batch", "build"])
def test_h_alone_points_at_help(abeja: Callable[..., Result], tmp_path: Path, command: str) -> None:
    """-h is the handler, as on ABEJA's CLI; a user who meant help is told where it is."""
    alone = abeja("model", command, "-h", cwd=tmp_path)
    assert alone.returncode == 2
    assert "-h needs the handler, as MODULE:FUNCTION" in alone.stderr
    assert "for help use --help" in alone.stderr


def test_abeja_sdk_option_spellings_are_accepted(
    abeja: Callable[..., Result], project: Callable[[str], Path]
) -> None:
    """``--device_type``, ``--organization_id``, ``--no_cache``, ``--v1`` parse (the run then
    stops at the missing input file, before any engine is touched)."""
    result = abeja(
        "model", "run-local", "--handler", "main:echo", "--image", "python:3.11-slim",
        "--device_type", "x86_cpu", "--organization_id", "1", "--no_cache", "--v1",
        "--environment", "A=1", "--quiet", "--input", "absent.bin",
        cwd=project("responder"),
    )  # fmt: skip
    assert result.returncode == 2, str(result)
    assert result.stderr == (
        "[error] input file not found: absent.bin; check the path given to --input\n"
    )


def _assert_nothing_made(cwd: Path) -> None:
    from abeja_cli.docker_engine import connect_docker
    from abeja_cli.errors import EngineUnavailable

    try:
        client = connect_docker(timeout=10)
    except EngineUnavailable:  # no engine here: nothing could have been made there either
        return
    try:
        assert ours(client, cwd) == []
        assert ours(client, cwd, "images") == []
    finally:
        client.close()
