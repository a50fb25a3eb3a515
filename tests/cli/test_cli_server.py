"""``abeja model run-local-server`` with the local engine: banner, serving, stopping on
SIGINT/SIGTERM with exit 0, and ``--reload``."""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import shlex
import shutil
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.cli import REPO, CliProcess, Result, http_request
from helpers.waiting import wait_until

Start = Callable[..., CliProcess]

VERSIONED = """\
def handler(request, context):
    return {{"content_type": "application/json", "content": {{"version": {version}}}}}
"""


@pytest.mark.parametrize(
    "sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["SIGINT", "SIGTERM", "SIGHUP"]
)
def test_serves_until_signal(start_abeja: Start, project: Callable[[str], Path], sig: int) -> None:
    cli = start_abeja(
        "model", "run-local-server", "--engine", "local", "-h", "main:handler",
        cwd=project("tax"),
    )  # fmt: skip
    endpoint = cli.endpoint()
    assert endpoint.startswith("http://127.0.0.1:")
    banner = "\n".join(cli.stdout)
    for expected in (
        " ----- Local Server ----- ",
        " Started successfully!",
        " Handler :  main:handler",
        "you can now access this http api!",
        "press Ctrl + C to stop",
        f" Try :      curl -s {endpoint} -H 'Content-Type: application/json' "
        "--data-binary @request.json",
    ):
        assert expected in banner
    assert http_request(endpoint, b'{"total_without_tax": 200}') == (200, b'{"total": 216.0}')
    assert http_request(endpoint, b"{}")[0] == 400
    status, body = http_request(endpoint + "/health_check")
    assert (status, json.loads(body)) == (200, {"status": "ok"})
    cli.wait_for(r"access: POST / 400")  # the model's log is followed while serving

    cli.send(sig)
    assert cli.wait(60) == 0, cli.output()
    assert cli.stderr[-1] == "[info] the model server was stopped and removed"
    with pytest.raises(OSError):
        http_request(endpoint + "/health_check", timeout=5)


def test_stop_and_start_again_on_the_same_port(
    start_abeja: Start, project: Callable[[str], Path]
) -> None:
    """The port's last connections are in TIME_WAIT after a stop; a second run starts at once."""
    from abeja_runtime.launch import free_port

    port = free_port()
    cwd = project("tax")
    for run in (1, 2):
        cli = start_abeja(
            "model", "run-local-server", "--engine", "local", "-h", "main:handler",
            "-p", str(port), cwd=cwd,
        )  # fmt: skip
        endpoint = cli.endpoint()
        assert endpoint == f"http://127.0.0.1:{port}", f"run {run}: {cli.output()}"
        # A keep-alive connection left open: the server closes it when it stops, so that end
        # of it stays in TIME_WAIT on the port.
        kept = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        kept.request("POST", "/", b'{"total_without_tax": 1}')
        assert kept.getresponse().read() == b'{"total": 1.08}'
        cli.send(signal.SIGINT)
        assert cli.wait(60) == 0, f"run {run}: {cli.output()}"
        kept.close()


def runtime_of(cli: CliProcess) -> int:
    """The pid of the runtime the CLI started (the local engine's child)."""
    pid = cli.process.pid
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    (runtime,) = (
        int(child)
        for child in children
        if b"abeja_runtime" in Path(f"/proc/{child}/cmdline").read_bytes()
    )
    return runtime


def test_reload_picks_up_a_changed_handler(start_abeja: Start, tmp_path: Path) -> None:
    (tmp_path / "main.py").write_text(VERSIONED.format(version=1))
    cli = start_abeja(
        "model", "run-local-server", "--engine", "local", "-h", "main:handler", "--reload",
        cwd=tmp_path,
    )  # fmt: skip
    endpoint = cli.endpoint()
    assert json.loads(http_request(endpoint, b"{}")[1]) == {"version": 1}
    runtime = runtime_of(cli)  # reloaded, never restarted

    mark = cli.mark()
    (tmp_path / "main.py").write_text(VERSIONED.format(version=22))
    cli.wait_for(r"\[info\] main\.py changed; reloading the model", since=mark)
    cli.wait_for(r"\[info\] the model server serves the new version at " + endpoint, since=mark)
    assert json.loads(http_request(endpoint, b"{}")[1]) == {"version": 22}

    # A broken edit keeps the CLI and the version before serving; the next good edit serves.
    mark = cli.mark()
    (tmp_path / "main.py").write_text("def handler(:\n")
    line = cli.wait_for(r"\[error\] the reload failed: ", since=mark)
    assert "SyntaxError" in line and line.endswith(
        f"; {endpoint} still answers with the version before; waiting for the next change"
    ), line
    assert json.loads(http_request(endpoint, b"{}")[1]) == {"version": 22}
    mark = cli.mark()
    (tmp_path / "main.py").write_text(VERSIONED.format(version=333))
    cli.wait_for(r"the model server serves the new version", timeout=60, since=mark)
    assert json.loads(http_request(endpoint, b"{}")[1]) == {"version": 333}
    assert cli.process.poll() is None and runtime_of(cli) == runtime

    cli.send(signal.SIGINT)
    assert cli.wait(60) == 0


def test_a_crashing_worker_does_not_end_the_server(start_abeja: Start, tmp_path: Path) -> None:
    (tmp_path / "main.py").write_text(
        "import os\n\ndef handler(request, context):\n    os._exit(3)\n"
    )
    cli = start_abeja(
        "model", "run-local-server", "--engine", "local", "-h", "main:handler", cwd=tmp_path
    )
    endpoint = cli.endpoint()
    # The worker dies mid-request: a connection error or a 500 are both fine.
    with contextlib.suppress(OSError):
        http_request(endpoint, b"{}", timeout=10)
    # The runtime's supervisor restarts a crashed worker, so the server stays up: the CLI too.
    assert http_request(endpoint + "/health_check", timeout=30)[0] in (200, 503)
    assert cli.process.poll() is None
    cli.send(signal.SIGTERM)
    assert cli.wait(60) == 0


def test_a_killed_cli_takes_its_local_runtime_along(
    start_abeja: Start, project: Callable[[str], Path]
) -> None:
    cli = start_abeja(
        "model", "run-local-server", "--engine", "local", "-h", "main:handler", cwd=project("tax")
    )
    endpoint = cli.endpoint()
    assert http_request(endpoint + "/health_check")[0] == 200
    cli.send(signal.SIGKILL)  # no chance to clean up: the kernel has to
    cli.wait(30)

    def gone() -> bool:
        try:
            http_request(endpoint + "/health_check", timeout=2)
        except OSError:
            return True
        return False

    wait_until(gone, 30, "the runtime of the killed CLI to stop")


@pytest.mark.parametrize("template", ["multipart", "image"])
def test_the_banners_curl_command_works_as_shown(
    start_abeja: Start, abeja: Callable[..., Result], tmp_path: Path, template: str
) -> None:
    """The banner's curl, run as shown, gets the answer the template makes (a multipart form,
    not text/plain; an image written to a file, not dumped on the terminal)."""
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed (apt-get install curl): the banner's command needs it")
    made = abeja("model", "init", "m", "--template", template, cwd=tmp_path)
    assert made.returncode == 0, str(made)
    cwd = tmp_path / "m"
    cli = start_abeja("model", "run-local-server", "--engine", "local", "-h", "main:handler",
                      cwd=cwd)  # fmt: skip
    cli.endpoint()
    line = cli.wait_for(r" Try :      curl ", stream="stdout")
    command = line.split(" Try :      ", 1)[1]
    ran = subprocess.run(command, shell=True, cwd=cwd, capture_output=True, timeout=60)
    assert ran.returncode == 0, ran
    if template == "multipart":
        answer = json.loads(ran.stdout)
        assert answer["fields"] == {"title": "notes"}, answer
        assert answer["files"][0]["file_name"] == "request.txt", answer
    else:
        assert ran.stdout == b""
        assert (cwd / "answer.jpg").read_bytes()[:3] == b"\xff\xd8\xff"


def test_the_server_has_no_drain_delay_unless_given(
    start_abeja: Start, project: Callable[[str], Path]
) -> None:
    """Nothing balances in front of it: a stop (Ctrl+C, --reload) need not wait (issue 31)."""
    cli = start_abeja(
        "model", "run-local-server", "--engine", "local", "-h", "main:variables",
        cwd=project("responder"),
    )  # fmt: skip
    status, body = http_request(cli.endpoint(), b'["ABEJA_RUNTIME_DRAIN_DELAY"]')
    assert (status, json.loads(body)) == (200, {"ABEJA_RUNTIME_DRAIN_DELAY": "0"})
    cli.send(signal.SIGINT)
    assert cli.wait(60) == 0, cli.output()


def test_the_readmes_batching_example_serves_batches_as_written(
    start_abeja: Start, tmp_path: Path
) -> None:
    """The README's batched handler, served by its run-local-server line (--max-batch-size),
    gets lists of requests and answers each."""
    pytest.importorskip("numpy")
    section = (REPO / "README.md").read_text("utf-8").split("### Batching requests", 1)[1]
    (tmp_path / "main.py").write_text(section.split("```python\n", 1)[1].split("```", 1)[0])
    (line,) = re.findall(r"`abeja model run-local-server ([^`]*)`", section.split("\n## ")[0])
    cli = start_abeja("model", "run-local-server", "--engine", "local", *shlex.split(line),
                      cwd=tmp_path)  # fmt: skip
    status, body = http_request(cli.endpoint(), b'{"x": [1, 2, 3, 4]}')
    assert status == 200, (body, cli.output())
    (y,) = json.loads(body).values()
    assert len(y) == 3, body
