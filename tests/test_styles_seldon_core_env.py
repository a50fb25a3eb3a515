"""The Seldon style served from inside seldon-core's environment, not beside it.

Seldon users keep seldon-core installed next to their model (``SeldonResponse``,
``SeldonClient``), and seldon-core 1.18 pins protobuf below 4 (issue 28: ``--grpc-port`` died
there on a protobuf API of 4.22). A fresh virtual environment gets seldon-core 1.18.2, then this
checkout with its ``grpc`` extra, as pip resolves it there; the runtime is started from that
environment with ``--grpc-port``, and answers REST and gRPC with a component that answers with
seldon-core's own ``SeldonResponse``. The gRPC client is seldon-core's messages, stubs and
``SeldonClient`` (``clients/seldon_grpc.py``), from the same environment.

pip then moves click and prometheus_client past seldon-core's pins (``<8.1``, ``<0.9``), which
the runtime's own requirements exceed; seldon-core's library, used here, still works.

The rest of the suite runs the runtime with the newest protobuf (this Python's), and
``test_styles_seldon_control.py`` puts seldon-core in a venv *beside* the runtime.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import HANDLERS, RunningServer, runtime_env

from abeja_runtime.launch import RuntimeProcess, free_port, runtime_command

SELDON_CORE = "1.18.2"
#: What pip gives under seldon-core's ``protobuf<4``: the last 3.x release.
PROTOBUF = "3.20.3"
REPO = Path(__file__).resolve().parents[1]
#: One install step: creating the venv, seldon-core and its pins, the checkout and the rest
#: (about 3, 14 and 8 s with pip's cache warm; tens of MB to download when it is cold).
_INSTALL_TIMEOUT = 240.0
#: A fresh venv's first start: seldon-core, numpy and grpcio imported for the first time.
_START_TIMEOUT = 60.0
#: pytest-timeout's 300 s would cut the three install steps short of their own bounds.
pytestmark = pytest.mark.timeout(3 * _INSTALL_TIMEOUT + 180)


@pytest.fixture(scope="module")
def seldon_core_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Python of a fresh venv with seldon-core installed and then this checkout (its grpc
    extra as pip resolves it beside seldon-core): a Seldon user's environment with the runtime
    added. Not editable: the runtime's files are in the venv, with the venv's protobuf."""
    root = tmp_path_factory.mktemp("seldon-core-env")
    venv = root / "venv"
    python = venv / "bin" / "python"
    pip = [str(python), "-m", "pip", "--disable-pip-version-check", "install", "-q"]
    for step in (
        [sys.executable, "-m", "venv", str(venv)],
        [*pip, f"seldon-core=={SELDON_CORE}"],
        [*pip, f"{_stage_checkout(root / 'source')}[grpc]"],
    ):
        _install_step(step, root / "probe")
    return python


def _install_step(step: list[str], scratch: Path) -> None:
    """Run one step; skip when PyPI cannot be reached (never in CI), else fail with pip's error."""
    done = subprocess.run(
        step,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=_INSTALL_TIMEOUT,
        check=False,
    )
    if done.returncode == 0:
        return
    if not os.environ.get("CI") and not _pypi_reachable(scratch):
        pytest.skip(f"PyPI is not reachable: seldon-core {SELDON_CORE} is installed from it")
    pytest.fail(f"{' '.join(step)} failed:\n{done.stderr[-3000:]}")


def _pypi_reachable(scratch: Path) -> bool:
    """Whether pip can fetch seldon-core's release (only PyPI has it)."""
    probe = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(scratch),
         f"seldon-core=={SELDON_CORE}"],
        capture_output=True,
        stdin=subprocess.DEVNULL,
        timeout=_INSTALL_TIMEOUT,
        check=False,
    )  # fmt: skip
    return probe.returncode == 0


def _stage_checkout(staging: Path) -> Path:
    """What the wheel is built from, copied: pip builds in the source folder, which must not be
    the checkout (other tests build there too)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    staging.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, staging)
    for package in ("abeja_runtime", "abeja_cli"):
        shutil.copytree(REPO / package, staging / package, ignore=ignore)
    return staging


@pytest.fixture
def serve_from(tmp_path: Path) -> Iterator[Any]:
    """``serve_from(python, handler_dir, *flags, env=...)``: the runtime started by ``python``
    (``python -m abeja_runtime``), as ``make_server`` starts it; stopped after the test."""
    started: list[RunningServer] = []

    def start(python: Path, handler_dir: str, *flags: str, env: dict[str, str]) -> RunningServer:
        lines: list[str] = []
        lock = threading.Lock()

        def keep(line: str) -> None:
            with lock:
                lines.append(line)

        args = ["--host", "127.0.0.1", "--port", "0", "--healthcheck-port", "0", *flags]
        runtime = RuntimeProcess(
            runtime_command(*args, python=str(python)),
            cwd=HANDLERS / handler_dir,
            env=runtime_env(TMPDIR=str(tmp_path), **env),
            on_line=keep,
        )
        server = RunningServer(runtime, lines, lock)
        started.append(server)
        server.wait_healthy(_START_TIMEOUT)
        return server

    yield start
    for server in started:
        try:
            server.stop(timeout=15)
        finally:
            server.runtime.kill()


def ask_grpc(python: Path, port: int, calls: list[tuple[str, Any]]) -> list[Any]:
    """Each call through seldon-core's messages and stubs, in its environment: ``[status,
    details, answer]``."""
    done = subprocess.run(
        [str(python), str(Path(__file__).parent / "clients" / "seldon_grpc.py"), str(port)],
        input=json.dumps(calls),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answers: list[Any] = json.loads(done.stdout)
    return answers


def test_seldon_grpc_and_rest_are_served_inside_seldon_core_s_environment(
    seldon_core_python: Path, serve_from: Any
) -> None:
    grpc_port = free_port()
    server = serve_from(
        seldon_core_python,
        "st_seldon_core_env",
        "--style", "seldon",
        "--grpc-port", str(grpc_port),
        env={"HANDLER": "Identity"},
    )  # fmt: skip
    # The component's own report of where it runs: seldon-core's release and its protobuf.
    tags = {"seldon_core": SELDON_CORE, "protobuf": PROTOBUF}

    answer = server.post_json({"data": {"ndarray": [[1, 2]]}}, path="/api/v1.0/predictions")
    assert (answer.status, answer.json()) == (
        200,
        {"data": {"names": ["t:0", "t:1"], "ndarray": [[1, 2]]}, "meta": {"tags": tags}},
    )

    # Every data form goes through protobuf's JSON mapping, 3.20's here.
    float_values = {"dtype": "DT_FLOAT", "tensorShape": {"dim": [{"size": "2"}]}}
    calls = [
        ("Model/Predict", {"data": {"ndarray": [[1, 2]]}}),
        ("Model/Predict", {"data": {"tensor": {"shape": [1, 2], "values": [1, 2]}}}),
        ("Model/Predict", {"data": {"tftensor": {**float_values, "floatVal": [1.5, 2.5]}}}),
        ("Model/Predict", {"jsonData": {"k": [1, 2]}}),
        ("Model/Predict", {"strData": "hello"}),
        ("Model/Predict", {"binData": "AAEC"}),
        ("Model/Metadata", {}),
        ("SeldonClient/predict", {"data": [[1.0, 2.0]], "payload_type": "ndarray"}),
    ]  # fmt: skip
    meta = {"meta": {"tags": tags}}
    names = ["t:0", "t:1"]
    assert ask_grpc(seldon_core_python, grpc_port, calls) == [
        ["OK", "", {**meta, "data": {"names": names, "ndarray": [[1.0, 2.0]]}}],
        ["OK", "", {**meta, "data": {"names": names, "tensor": {"shape": [1, 2],
                                                                "values": [1.0, 2.0]}}}],
        ["OK", "", {**meta, "data": {"tftensor": {**float_values,
                                                  "tensorContent": "AADAPwAAIEA="}}}],
        ["OK", "", {**meta, "jsonData": {"k": [1.0, 2.0]}}],
        ["OK", "", {**meta, "strData": "hello"}],
        ["OK", "", {**meta, "binData": "AAEC"}],
        ["OK", "", {"versions": [""]}],
        ["OK", "", {**meta, "data": {"names": names, "ndarray": [[1.0, 2.0]]}}],
    ]  # fmt: skip
