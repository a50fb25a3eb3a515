"""The Seldon style served from inside seldon-core's environment, not beside it.

Seldon users keep seldon-core installed next to their model (``SeldonResponse``,
``SeldonClient``), and seldon-core 1.18 pins protobuf below 4 (issue 28: ``--grpc-port`` died
there on a protobuf API of 4.22), click below 8.1 and prometheus-client below 0.9. A fresh
virtual environment is made as a project's image is (``images/project.Dockerfile``) and as the
CLI's local engine makes one: this checkout first (with its ``grpc`` extra), then a project's
``requirements.txt`` holding seldon-core 1.18.2, which takes protobuf, click and
prometheus_client down to 3.20.3, 8.0.4 and 0.8.0. pip must find nothing broken there (so the
runtime's ranges also let one ``pip install seldon-core==1.18.2 'abeja-runtime[grpc]'``
resolve). The runtime is started from that environment with ``--grpc-port`` and answers REST
and gRPC with a component that answers with seldon-core's own ``SeldonResponse`` and reports
Seldon metrics, which the health-check port's ``/metrics`` serves (prometheus_client 0.8 reads
another variable than the newest, and has no gauge mode that keeps the latest value). The gRPC
client is seldon-core's messages, stubs and ``SeldonClient`` (``clients/seldon_grpc.py``), and
``abeja model run-local`` the environment's own CLI (click 8.0.4).

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
from helpers.metrics import scrape, total
from helpers.servers import HANDLERS, RunningServer, runtime_env

from abeja_runtime.launch import RuntimeProcess, free_port, runtime_command

SELDON_CORE = "1.18.2"
#: What pip gives under seldon-core's pins (``protobuf<4``, ``click<8.1``,
#: ``prometheus-client<0.9``): the last release below each; the component reports them.
RELEASES = {
    "seldon_core": SELDON_CORE,
    "protobuf": "3.20.3",
    "click": "8.0.4",
    "prometheus_client": "0.8.0",
}
REPO = Path(__file__).resolve().parents[1]
#: One install step: creating the venv, the checkout and its requirements, then seldon-core and
#: its pins (about 3, 9 and 9 s with pip's cache warm; tens of MB to download when it is cold).
_INSTALL_TIMEOUT = 240.0
#: A fresh venv's first start: seldon-core, numpy and grpcio imported for the first time.
_START_TIMEOUT = 60.0
#: pytest-timeout's 300 s would cut the three install steps short of their own bounds.
pytestmark = pytest.mark.timeout(3 * _INSTALL_TIMEOUT + 180)


@pytest.fixture(scope="module")
def seldon_core_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Python of a fresh venv with this checkout (its grpc extra) and then a project's
    requirements.txt of seldon-core installed on top, in the order of a project's image
    (the runtime's image, then ``pip install -r requirements.txt``) and of the local engine.
    Not editable: the runtime's files are in the venv, with the venv's releases."""
    root = tmp_path_factory.mktemp("seldon-core-env")
    venv = root / "venv"
    python = venv / "bin" / "python"
    requirements = root / "requirements.txt"
    requirements.write_text(f"seldon-core=={SELDON_CORE}\n")
    pip = [str(python), "-m", "pip", "--disable-pip-version-check", "install", "-q"]
    for step in (
        [sys.executable, "-m", "venv", str(venv)],
        [*pip, f"{_stage_checkout(root / 'source')}[grpc]"],
        [*pip, "-r", str(requirements)],
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


def pip_check(python: Path) -> str:
    """What ``pip check`` says of the environment (its own line when nothing is broken)."""
    done = subprocess.run(
        [str(python), "-m", "pip", "--disable-pip-version-check", "check"],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
        check=False,
    )
    return done.stdout + done.stderr


def run_local(python: Path, project: Path, body: Any, tmp_path: Path) -> Any:
    """The answer of ``abeja model run-local --engine local`` (the environment's own CLI) to
    ``body`` sent as JSON: the local engine serves the project with that same Python, as it
    does from the venv it makes for a project whose requirements.txt holds seldon-core."""
    done = subprocess.run(
        [str(python.parent / "abeja"), "model", "run-local", "--engine", "local",
         "-h", "Identity:Identity", "--input", "-", "--content-type", "application/json", "-q"],
        input=json.dumps(body),
        capture_output=True,
        text=True,
        cwd=project,
        env=runtime_env(TMPDIR=str(tmp_path)),
        timeout=120,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_inside_seldon_core_s_environment_rest_grpc_metrics_and_run_local_are_served(
    seldon_core_python: Path, serve_from: Any, tmp_path: Path
) -> None:
    """One test, so that the environment is made once per run (xdist spreads a module's tests
    over its workers, each of which would make its own)."""
    # The requirements.txt step took click and prometheus_client down to seldon-core's pins:
    # the runtime's own ranges take them (else pip warns at that step, and one
    # `pip install seldon-core==1.18.2 'abeja-runtime[grpc]'` is ResolutionImpossible).
    assert pip_check(seldon_core_python) == "No broken requirements found.\n"

    grpc_port = free_port()
    server = serve_from(
        seldon_core_python,
        "st_seldon_core_env",
        "--style", "seldon",
        "--grpc-port", str(grpc_port),
        # The metrics are only exported: the answers stay SeldonMessages with tags alone.
        # Traces asked for where the otel extra is not installed (seldon-core's protobuf<4
        # leaves no room for it): one warning, and the runtime serves.
        env={
            "HANDLER": "Identity", "INCLUDE_METRICS_IN_CLIENT_RESPONSE": "false",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
        },
    )  # fmt: skip
    tracing = [r for r in server.records() if "tracing is off" in str(r.get("message"))]
    assert [r["message"] for r in tracing] == [
        "tracing is off: the OpenTelemetry packages are not installed "
        "(pip install 'abeja-runtime[otel]')"
    ]
    # The component's own report of where it runs: seldon-core's release and those it pins.
    tags = RELEASES

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

    # Eight predictions (one REST, seven gRPC), each reporting its three metrics from the
    # handler process; the health-check port's /metrics sums them from the workers' files.
    samples = scrape(server)
    assert total(samples, "predictions_total") == 8  # metrics()'s COUNTER
    assert total(samples, "inference_count") == 8  # the response's TIMER, in seconds
    assert total(samples, "inference_sum") == pytest.approx(8 * 0.0015)
    # The GAUGE: prometheus_client 0.8 keeps each live worker's latest value, labelled by its
    # pid (as seldon-core labels by worker); the newest releases keep the latest of all.
    gauges = [(sorted(dict(labels)), v) for (n, labels), v in samples.items() if n == "temperature"]
    assert gauges == [(["pid", "room"], 21.5)]
    assert total(samples, "abeja_runtime_requests_total", code="200") == 9  # and the Metadata

    project = shutil.copytree(HANDLERS / "st_seldon_core_env", tmp_path / "project")
    assert run_local(seldon_core_python, project, {"data": {"ndarray": [[1, 2]]}}, tmp_path) == {
        "data": {"names": ["t:0", "t:1"], "ndarray": [[1, 2]]},
        "meta": {
            "tags": tags,
            "metrics": [
                {"type": "COUNTER", "key": "predictions", "value": 1},
                {"type": "GAUGE", "key": "temperature", "value": 21.5, "tags": {"room": "a"}},
                {"type": "TIMER", "key": "inference", "value": 1.5},
            ],
        },
    }
