"""The ``abeja-runtime`` command: flags, environment variables, defaults, errors, packaging
(issue point 2; contract A1 "every limit is a flag and a variable")."""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from helpers.servers import TIMED_OUT_AFTER_1_S, RunningServer, runtime_env
from helpers.waiting import wait_until

from abeja_runtime.launch import free_ports

COMMAND_TIMEOUT = 20.0


def abeja_runtime(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None):
    executable = shutil.which("abeja-runtime")
    assert executable is not None, "the abeja-runtime script is not on PATH"
    return subprocess.run(
        [executable, *args],
        cwd=cwd,
        env=runtime_env(**(env or {})),
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
        stdin=subprocess.DEVNULL,
        check=False,
    )


# --- packaging -----------------------------------------------------------------------------------


def test_the_abeja_runtime_script_is_installed():
    assert shutil.which("abeja-runtime") is not None


def test_version_is_printed_by_the_script_and_the_module(tmp_path):
    version = importlib.metadata.version("abeja-runtime")
    script = abeja_runtime("--version", cwd=tmp_path)
    module = subprocess.run(
        [sys.executable, "-m", "abeja_runtime", "--version"],
        cwd=tmp_path,
        env=runtime_env(),
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
        check=False,
    )
    for result in (script, module):
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == f"abeja-runtime, version {version}"


# --- --help --------------------------------------------------------------------------------------

#: (flag, environment variable, default as --help shows it); None: not checked.
DOCUMENTED = [
    ("--handler", "HANDLER", "main:handler"),
    ("--port", "PORT", "5000"),
    ("--healthcheck-port", "HEALTHCHECK_PORT", "5001"),
    ("--host", None, None),
    ("--workers", "ABEJA_RUNTIME_WORKERS", None),
    ("--concurrency", "ABEJA_RUNTIME_CONCURRENCY", "1"),
    ("--max-queue", "ABEJA_RUNTIME_MAX_QUEUE", None),
    ("--timeout", "ABEJA_RUNTIME_TIMEOUT", "60"),
    ("--max-body-size", "ABEJA_RUNTIME_MAX_BODY_SIZE", "100MiB"),
    ("--spool-threshold", "ABEJA_RUNTIME_SPOOL_THRESHOLD", "1MiB"),
    ("--max-parts", "ABEJA_RUNTIME_MAX_PARTS", "1000"),
    ("--max-requests", "ABEJA_RUNTIME_MAX_REQUESTS", "0"),
    ("--max-worker-memory", "ABEJA_RUNTIME_MAX_WORKER_MEMORY", "0"),
    ("--max-image-pixels", "ABEJA_RUNTIME_MAX_IMAGE_PIXELS", "89478485"),
    ("--grace-period", "ABEJA_RUNTIME_GRACE_PERIOD", "30"),
    ("--log-level", "LOG_LEVEL", "info"),
    ("--loop", "ABEJA_RUNTIME_LOOP", "auto"),
    ("--cancel-raises", "ABEJA_RUNTIME_CANCEL_RAISES", "off"),
    ("--install-requirements", "ABEJA_RUNTIME_INSTALL_REQUIREMENTS", "off"),
    ("--parameters", "PREDICTIVE_UNIT_PARAMETERS", None),
    ("--model-metadata", "MODEL_METADATA", None),
    ("--predictive-unit-id", "PREDICTIVE_UNIT_ID", None),
]


def help_blocks(text: str) -> dict[str, str]:
    """Each option's help, whitespace collapsed, keyed by its first flag."""
    blocks: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        match = re.match(r"^  (-[-\w]+)", line)
        if match:
            current = match.group(1)
            blocks[current] = ""
        if current is not None:
            blocks[current] += " " + line.strip()
    return {flag: " ".join(block.split()) for flag, block in blocks.items()}


@pytest.fixture(scope="module")
def help_text(tmp_path_factory) -> str:
    result = abeja_runtime("--help", cwd=tmp_path_factory.mktemp("help"))
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize(("flag", "env", "default"), DOCUMENTED, ids=[d[0] for d in DOCUMENTED])
def test_help_documents_every_flag_its_variable_and_default(help_text, flag, env, default):
    blocks = help_blocks(help_text)
    assert flag in blocks, help_text
    if env is not None:
        assert f"env var: {env}" in blocks[flag], blocks[flag]
    if default is not None:
        assert re.search(rf"default: {re.escape(default)}\b", blocks[flag]), blocks[flag]


def test_help_names_the_other_commands(help_text):
    for command in ("abeja-runtime batch", "abeja-runtime kserve"):
        assert command in help_text, help_text


# --- bad values ----------------------------------------------------------------------------------

#: (flag, environment variable, bad value, text the error line must contain)
BAD_VALUES = [
    ("--port", "PORT", "70000", "70000"),
    ("--port", "PORT", "http", "http"),
    ("--healthcheck-port", "HEALTHCHECK_PORT", "-1", "-1"),
    ("--workers", "ABEJA_RUNTIME_WORKERS", "0", "0"),
    ("--workers", "ABEJA_RUNTIME_WORKERS", "many", "many"),
    ("--concurrency", "ABEJA_RUNTIME_CONCURRENCY", "0", "0"),
    ("--concurrency", "ABEJA_RUNTIME_CONCURRENCY", "two", "two"),
    ("--max-queue", "ABEJA_RUNTIME_MAX_QUEUE", "-1", "-1"),
    ("--timeout", "ABEJA_RUNTIME_TIMEOUT", "-5", "-5"),
    ("--timeout", "ABEJA_RUNTIME_TIMEOUT", "soon", "soon"),
    ("--max-body-size", "ABEJA_RUNTIME_MAX_BODY_SIZE", "100XB", "100XB"),
    ("--max-body-size", "ABEJA_RUNTIME_MAX_BODY_SIZE", "-1", "-1"),
    ("--spool-threshold", "ABEJA_RUNTIME_SPOOL_THRESHOLD", "lots", "lots"),
    ("--max-parts", "ABEJA_RUNTIME_MAX_PARTS", "-5", "-5"),
    ("--grace-period", "ABEJA_RUNTIME_GRACE_PERIOD", "-1", "-1"),
    ("--grace-period", "ABEJA_RUNTIME_GRACE_PERIOD", "forever", "forever"),
    ("--log-level", "LOG_LEVEL", "loud", "loud"),
    ("--handler", "HANDLER", "main:handler:extra", "main:handler:extra"),
    ("--context", "CONTEXT", "{broken", "CONTEXT"),
    ("--devices", "ABEJA_RUNTIME_DEVICES", "abc", "must be GPU ids separated by commas"),
    ("--devices", "ABEJA_RUNTIME_DEVICES", "0,,1", "must be GPU ids separated by commas"),
    ("--cancel-raises", "ABEJA_RUNTIME_CANCEL_RAISES", "maybe", "'maybe' is not on or off"),
]


@pytest.mark.parametrize("via", ["flag", "env"])
@pytest.mark.parametrize(
    ("flag", "env", "value", "fragment"),
    BAD_VALUES,
    ids=[f"{flag}={value}" for flag, _, value, _ in BAD_VALUES],
)
def test_a_bad_value_is_one_line_and_exit_2(tmp_path, via, flag, env, value, fragment):
    args = ["--host", "127.0.0.1"]
    if flag not in ("--port", "--healthcheck-port"):
        args += ["--port", "0", "--healthcheck-port", "0"]
    if via == "flag":
        result = abeja_runtime(*args, flag, value, cwd=tmp_path)
    else:
        result = abeja_runtime(*args, env={env: value}, cwd=tmp_path)
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("abeja-runtime: error: "), lines[0]
    assert fragment in lines[0], lines[0]
    assert result.stdout == ""


@pytest.mark.parametrize("via", ["flag", "env"])
def test_equal_ports_are_one_line_and_exit_2(tmp_path, via):
    if via == "flag":
        result = abeja_runtime("--port", "6000", "--healthcheck-port", "6000", cwd=tmp_path)
    else:
        result = abeja_runtime(env={"PORT": "6000", "HEALTHCHECK_PORT": "6000"}, cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("abeja-runtime: error: ")
    assert "6000" in lines[0]


# --- settings take effect, by flag and by environment variable -----------------------------------


def setting(via: str, flag: str, env: str, value: str) -> dict:
    """make_server arguments that set one option on the command line or in the environment."""
    if via == "flag":
        return {"flags": (flag, value), "env": {}}
    return {"flags": (), "env": {env: value}}


VIAS = pytest.mark.parametrize("via", ["flag", "env"])


@VIAS
def test_handler_setting(make_server, via):
    chosen = setting(via, "--handler", "HANDLER", "main:other")
    server = make_server("mn_probe", *chosen["flags"], env=chosen["env"])
    assert server.request("GET", "/").json()["which"] == "other"


@VIAS
def test_timeout_setting_gives_504(make_server, tmp_path, via):
    chosen = setting(via, "--timeout", "ABEJA_RUNTIME_TIMEOUT", "1")
    server = make_server("sd_slow", *chosen["flags"], env=chosen["env"])
    release = tmp_path / "release"
    try:
        # The work cannot end before the test creates ``release`` (nor, by itself, within the
        # client's 30 s): the 504 comes from the 1 s deadline, while the handler still runs.
        answer = server.post_json({"release": str(release)}, timeout=30)
    finally:
        release.touch()
    assert (answer.status, answer.json()) == (504, TIMED_OUT_AFTER_1_S)


@VIAS
def test_max_body_size_setting_gives_413(make_server, via):
    chosen = setting(via, "--max-body-size", "ABEJA_RUNTIME_MAX_BODY_SIZE", "10")
    server = make_server("mn_probe", *chosen["flags"], env=chosen["env"])
    octets = {"Content-Type": "application/octet-stream"}
    assert server.request("POST", "/", b"x" * 10, octets).json()["size"] == 10
    answer = server.request("POST", "/", b"x" * 11, octets)
    assert (answer.status, answer.json()) == (
        413,
        {"status": "request body too large (limit 10 bytes)"},
    )


@VIAS
def test_spool_threshold_setting_spools_larger_bodies(make_server, via):
    chosen = setting(via, "--spool-threshold", "ABEJA_RUNTIME_SPOOL_THRESHOLD", "16")
    server = make_server("mn_probe", *chosen["flags"], env=chosen["env"])
    octets = {"Content-Type": "application/octet-stream"}
    assert server.request("POST", "/", b"x" * 16, octets).json()["spooled"] is False
    assert server.request("POST", "/", b"x" * 17, octets).json() == {
        "which": "handler",
        "size": 17,
        "spooled": True,
    }


def test_defaults_keep_a_megabyte_in_memory(make_server):
    server = make_server("mn_probe")
    octets = {"Content-Type": "application/octet-stream"}
    assert server.request("POST", "/", b"x" * (1 << 20), octets).json()["spooled"] is False
    assert server.request("POST", "/", b"x" * ((1 << 20) + 1), octets).json()["spooled"] is True


def post_in_thread(server: RunningServer, body: dict, results: list) -> threading.Thread:
    def call() -> None:
        try:
            results.append(server.post_json(body, timeout=15))
        except Exception as exc:  # the test inspects it
            results.append(exc)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread


@VIAS
def test_concurrency_setting_runs_calls_at_once(make_server, via):
    chosen = setting(via, "--concurrency", "ABEJA_RUNTIME_CONCURRENCY", "2")
    server = make_server("mn_barrier", *chosen["flags"], env=chosen["env"])
    results: list = []
    threads = [post_in_thread(server, {}, results) for _ in range(2)]
    for thread in threads:
        thread.join(15)
    assert [(r.status, r.json()) for r in results] == [(200, {"met": True})] * 2


@VIAS
def test_max_queue_setting_answers_busy(make_server, tmp_path, via):
    chosen = setting(via, "--max-queue", "ABEJA_RUNTIME_MAX_QUEUE", "0")
    server = make_server("hl_blocking", *chosen["flags"], env=chosen["env"])
    paths = {"started": str(tmp_path / "started"), "release": str(tmp_path / "release")}
    results: list = []
    blocked = post_in_thread(server, paths, results)
    wait_until((tmp_path / "started").exists, 10, "the handler call to start")
    busy = server.post_json(paths)
    assert (busy.status, busy.json()) == (503, {"status": "service busy"})
    assert busy.headers["Retry-After"]
    (tmp_path / "release").touch()
    blocked.join(15)
    assert [(r.status, r.json()) for r in results] == [(200, {"released": True})]


@VIAS
def test_workers_setting_starts_that_many_workers(make_server, via):
    chosen = setting(via, "--workers", "ABEJA_RUNTIME_WORKERS", "2")
    server = make_server("ld_sync", *chosen["flags"], env=chosen["env"])

    def ready_workers() -> set[str]:
        messages = {str(r.get("message", "")) for r in server.records()}
        return {m for m in messages if re.fullmatch(r"worker \d+ is ready", m)}

    wait_until(lambda: len(ready_workers()) == 2, 10, "two workers to be ready")
    assert server.request("GET", "/").json() == {"kind": "sync"}


@VIAS
def test_grace_period_setting_bounds_shutdown(make_server, tmp_path, via):
    chosen = setting(via, "--grace-period", "ABEJA_RUNTIME_GRACE_PERIOD", "1")
    server = make_server("sd_slow", *chosen["flags"], env=chosen["env"])
    results: list = []
    # ``release`` is never created: the call would run 60 s, past the default 30 s grace period.
    body = {"started": str(tmp_path / "started"), "release": str(tmp_path / "release")}
    call = post_in_thread(server, body, results)
    wait_until((tmp_path / "started").exists, 10, "the slow call to start")
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(30) == 0  # bounds the wait only: the record says why it stopped
    stopped = server.wait_for_record(lambda r: "still running after" in r.get("message", ""))
    assert stopped["message"] == (
        "1 request(s) still running after the 1 s grace period; stopping anyway"
    )
    call.join(5)
    assert results and (isinstance(results[0], Exception) or results[0].status != 200), results


# --- precedence ----------------------------------------------------------------------------------


def test_flag_beats_env_for_the_handler(make_server):
    server = make_server("mn_probe", "--handler", "main:handler", env={"HANDLER": "main:other"})
    assert server.request("GET", "/").json()["which"] == "handler"


def test_flag_beats_env_for_a_limit(make_server):
    env = {"ABEJA_RUNTIME_MAX_BODY_SIZE": "10"}
    server = make_server("mn_probe", "--max-body-size", "100", env=env)
    answer = server.request("POST", "/", b"x" * 50, {"Content-Type": "application/octet-stream"})
    assert (answer.status, answer.json()["size"]) == (200, 50)


# --- PORT and HEALTHCHECK_PORT -------------------------------------------------------------------


def test_port_variables_choose_the_ports(make_server):
    port, healthcheck_port = free_ports(2)
    server = make_server(
        "ld_sync",
        env={"PORT": str(port), "HEALTHCHECK_PORT": str(healthcheck_port)},
        ports=(port, healthcheck_port),
    )
    started = server.wait_for_record(lambda r: "port" in r, timeout=COMMAND_TIMEOUT)
    assert (started["port"], started["healthcheck_port"]) == (port, healthcheck_port)
    assert server.request("GET", "/").json() == {"kind": "sync"}


# --- --loop ------------------------------------------------------------------------------------


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize("handler", ["main:handler", "main:async_handler"])
def test_each_event_loop_serves_sync_and_async_handlers(make_server, loop, handler):
    """CI installs uvloop (the test extra), so ``auto`` runs the rest of the suite on it; this
    keeps the plain asyncio loop, what a default install runs, covered as well."""
    server = make_server("ex_stream", "--loop", loop, "--handler", handler)
    started = server.wait_for_record(lambda r: "loop=" in r.get("message", ""))

    answer = server.request("GET", "/?chunks=3&pause=0&tag=t")
    lines = answer.body.decode().splitlines()

    assert f"loop={loop}" in started["message"]
    assert answer.status == 200
    assert [line.split()[1] for line in lines] == ["begin", "0", "1", "2"]


def test_auto_loop_is_uvloop_when_it_is_installed(make_server):
    server = make_server("ld_sync")
    started = server.wait_for_record(lambda r: "loop=" in r.get("message", ""))
    assert "loop=uvloop" in started["message"]
