"""JSON-lines logs, access records, captured prints, request ids (issue point 9; A5, B 6.1)."""

from __future__ import annotations

import json
import re
import signal

import pytest
from helpers.servers import HANDLERS, RunningServer

from abeja_runtime.launch import free_ports

#: ``2026-11-21T18:14:14.672+00:00`` (records) and ``...14.672123+00:00`` (access timestamps).
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d$")
MICROSECOND_TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}[+-]\d\d:\d\d$")
REQUEST_ID = "x-abeja-request-id"
REQUESTER_ID = "x-abeja-requester-id"


@pytest.fixture
def spawn(make_server):
    """Start a runtime on fixed free ports, for settings that hide the start-up record that
    conftest's factory reads the ports from."""

    def start(folder: str, *flags: str, env: dict[str, str]) -> RunningServer:
        ports = tuple(free_ports(2))
        flags = ("--port", str(ports[0]), "--healthcheck-port", str(ports[1]), *flags)
        return make_server(folder, *flags, env=env, ports=ports)

    return start


def stop(server: RunningServer) -> int:
    """SIGTERM, then wait for the exit and for the last log line to be read."""
    return server.stop()


def echo(server: RunningServer, say: str, warn: str, headers: dict[str, str] | None = None):
    answer = server.post_json({"say": say, "warn": warn}, headers=headers or {})
    assert answer.status == 200, answer.body
    return answer


def access_records(server: RunningServer, request_id: str) -> list[dict]:
    return [
        record
        for record in server.records()
        if record.get("log_type") == "access_log" and record.get("request_id") == request_id
    ]


def test_every_line_on_stdout_is_a_json_object(make_server):
    server = make_server("lg_echo")
    echo(server, "hello from the handler", "careful")
    assert server.request("GET", "/", headers={"Content-Type": "text/plain"}).status == 500
    assert stop(server) == 0
    assert server.lines, "the runtime wrote nothing"
    for line in server.lines:
        record = json.loads(line)
        assert isinstance(record, dict), line
        assert record["log_level"] in {"debug", "info", "warning", "error", "fatal"}, line
        assert TIMESTAMP.match(record["timestamp"]), line


@pytest.mark.parametrize("folder", ["lg_echo", "lg_echo_async"])
def test_one_access_record_per_request(make_server, folder):
    server = make_server(folder)
    ids = [f"access-{folder}-{n}" for n in range(3)]
    for request_id in ids:
        echo(server, "hi", "careful", {REQUEST_ID: request_id})
    failed = server.request(
        "DELETE", "/items/7?token=secret", b"not json", {REQUEST_ID: "access-failed"}
    )
    assert failed.status == 500

    expected = [(request_id, "POST", "/", 200) for request_id in ids]
    expected.append(("access-failed", "DELETE", "/items/7", 500))  # the query is not logged
    for request_id, method, path, status in expected:
        server.wait_for_record(
            lambda r, request_id=request_id: (
                r.get("request_id") == request_id and r.get("log_type") == "access_log"
            )
        )
        records = access_records(server, request_id)
        assert len(records) == 1, records
        record = records[0]
        assert record["http_method"] == method
        assert record["http_path"] == path
        assert record["http_status"] == status
        assert record["log_level"] == "info"
        assert isinstance(record["elapsed_microsecs"], int)
        assert record["elapsed_microsecs"] >= 0
        assert MICROSECOND_TIMESTAMP.match(record["request_timestamp"]), record
        assert MICROSECOND_TIMESTAMP.match(record["response_timestamp"]), record
        assert record["request_timestamp"] <= record["response_timestamp"]
        assert TIMESTAMP.match(record["timestamp"]), record
        assert record["timestamp"] == record["response_timestamp"][:23] + "+00:00"
        assert "message" not in record
    total = [r for r in server.records() if r.get("log_type") == "access_log"]
    assert len(total) == len(expected), "health checks or other requests logged as access"


def test_the_last_access_records_are_written_at_shutdown(make_server):
    """Records are written in batches (every 50 ms or 256 records): the runtime's stop writes
    those it still holds, before the workers log theirs."""
    server = make_server("lg_echo")
    for n in range(20):
        echo(server, "hi", "careful", {REQUEST_ID: f"last-{n}"})
    assert server.stop(signal.SIGTERM) == 0
    logged = {r.get("request_id") for r in server.records() if r.get("log_type") == "access_log"}
    assert {f"last-{n}" for n in range(20)} <= logged


@pytest.mark.parametrize("folder", ["lg_echo", "lg_echo_async"])
def test_handler_prints_become_records_with_the_request_id(make_server, folder):
    server = make_server(folder)
    say, warn = f"stdout line from {folder}", f"stderr line from {folder}"
    headers = {REQUEST_ID: f"prints-{folder}", REQUESTER_ID: "user-1234"}
    echo(server, say, warn, headers)
    printed = server.wait_for_record(lambda r: r.get("message") == say)
    warned = server.wait_for_record(lambda r: r.get("message") == warn)
    for record, level in ((printed, "info"), (warned, "warning")):
        assert record["log_level"] == level
        assert record["request_id"] == f"prints-{folder}"
        assert record["requester_id"] == "user-1234"


def test_client_request_id_is_echoed_and_used_in_logs(make_server):
    server = make_server("lg_echo")
    answer = echo(server, "with id", "warn with id", {REQUEST_ID: "client-chosen-id-42"})
    assert answer.headers[REQUEST_ID] == "client-chosen-id-42"
    assert answer.json() == {"request_id": "client-chosen-id-42"}
    server.wait_for_record(lambda r: r.get("message") == "with id")
    server.wait_for_record(lambda r: r.get("log_type") == "access_log")
    assert len(access_records(server, "client-chosen-id-42")) == 1


def test_a_request_id_is_generated_when_absent(make_server):
    server = make_server("lg_echo")
    generated = []
    for n in range(2):
        answer = echo(server, f"no id {n}", f"no id warn {n}")
        request_id = answer.headers[REQUEST_ID]
        assert request_id, "no request id header in the response"
        assert answer.json() == {"request_id": request_id}
        printed = server.wait_for_record(lambda r, n=n: r.get("message") == f"no id {n}")
        assert printed["request_id"] == request_id
        server.wait_for_record(lambda r, i=request_id: r.get("request_id") == i and "log_type" in r)
        generated.append(request_id)
    assert generated[0] != generated[1]


def test_requester_id_appears_in_the_access_record(make_server):
    server = make_server("lg_echo")
    headers = {REQUEST_ID: "with-requester", REQUESTER_ID: "requester-77"}
    echo(server, "from requester", "warn from requester", headers)
    record = server.wait_for_record(
        lambda r: r.get("log_type") == "access_log" and r.get("request_id") == "with-requester"
    )
    assert record["requester_id"] == "requester-77"


@pytest.mark.parametrize(
    ("flags", "env"),
    [((), {"LOG_LEVEL": "warning"}), (("--log-level", "warning"), {})],
    ids=["env", "flag"],
)
def test_log_level_warning_hides_info_records(spawn, flags, env):
    server = spawn("lg_echo", *flags, env=env)
    echo(server, "an info line", "a warning line", {REQUEST_ID: "quiet"})
    warned = server.wait_for_record(lambda r: r.get("message") == "a warning line")
    assert warned["log_level"] == "warning"
    assert stop(server) == 0
    info = [r for r in server.records() if r.get("log_level") in {"info", "debug"}]
    assert info == [], info


def test_a_handler_traceback_starts_at_the_users_frame(make_server):
    server = make_server("lg_echo")
    failed = server.request("POST", "/", b"not json", {"Content-Type": "application/json"})
    assert failed.status == 500
    record = server.wait_for_record(
        lambda r: r.get("message", "").startswith("unexpected error occurred in the handler")
    )
    frames = [line for line in record["traceback"].splitlines() if line.startswith("  File ")]
    assert frames[0].startswith(f'  File "{HANDLERS / "lg_echo" / "main.py"}"'), frames
    assert not any("abeja_runtime" in frame for frame in frames), frames
    assert record["traceback"].rstrip().splitlines()[-1].startswith("json.decoder.JSONDecodeError")
