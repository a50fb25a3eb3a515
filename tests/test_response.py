"""Turning the handler's dict into HTTP (issue point 6; contract A3 and Part B 5)."""

from __future__ import annotations

import sys

import pytest
from helpers.servers import HANDLERS

sys.path.insert(0, str(HANDLERS / "rs_table"))
from cases import CASES

from abeja_runtime import __version__


@pytest.fixture(scope="module")
def table_server(make_module_server):
    """One server for the whole table: starting one per row would dominate the run time."""
    return make_module_server("rs_table")


@pytest.mark.parametrize("name", sorted(CASES))
def test_serialisation_table(table_server, name):
    _, content_type, expected = CASES[name]
    answer = table_server.request("GET", f"/?case={name}")
    assert answer.status == 200
    assert answer.body == expected
    assert answer.headers["Content-Type"] == (content_type or "text/plain")


def test_default_content_type_and_runtime_headers(table_server):
    answer = table_server.request("GET", "/?case=none")
    assert answer.headers["Content-Type"] == "text/plain"
    assert answer.headers["Content-Length"] == "0"
    assert answer.headers["x-abeja-sys-meta-runtime-version"] == __version__


def test_metadata_becomes_headers_but_cannot_override_framing(make_server):
    server = make_server("rs_table", "--handler", "main:with_metadata")
    answer = server.request("GET", "/")
    assert answer.status == 201
    assert answer.headers["x-custom"] == "v"
    assert answer.headers["X-Number"] == "42"
    assert answer.headers["Content-Type"] == "application/json"
    assert answer.headers["Content-Length"] == str(len(answer.body))
    assert answer.headers["x-abeja-sys-meta-runtime-version"] == __version__
    assert answer.body == b'{"ok": true}'
    # The log arrives through a pipe read by another thread: wait for it, bounded.
    warning = server.wait_for_record(
        lambda r: r.get("log_level") == "warning" and "metadata" in r.get("message", "")
    )
    assert "the runtime controls" in warning["message"]


def test_platform_ids_become_headers(make_server):
    env = {
        "ABEJA_MODEL_ID": "111",
        "ABEJA_MODEL_VERSION": "1.0 β/x",
        "ABEJA_DEPLOYMENT_ID": "222",
        "ABEJA_SERVICE_ID": "333",
    }
    server = make_server("rs_table", env=env)
    answer = server.request("GET", "/?case=dict")
    assert answer.headers["X-Abeja-Model-Id"] == "111"
    assert answer.headers["X-Abeja-Model-Version"] == "1.0%20%CE%B2%2Fx"
    assert answer.headers["X-Abeja-Deployment-Id"] == "222"
    assert answer.headers["X-Abeja-Service-Id"] == "333"


def test_streamed_file_is_sent_chunked_and_byte_exact(make_server):
    server = make_server("rs_table", "--handler", "main:stream_file")
    answer = server.request("GET", "/")
    assert answer.body == (HANDLERS / "rs_table" / "main.py").read_bytes()
    assert answer.headers["Transfer-Encoding"] == "chunked"


@pytest.mark.parametrize("status", [201, 204, 400, 404, 418, 503])
def test_status_codes_pass_through(make_server, status):
    server = make_server("rs_table", "--handler", "main:status_only")
    answer = server.request("GET", f"/?status={status}")
    assert answer.status == status
    assert answer.body == b""


def test_an_answer_above_64_kib_arrives_whole(make_server, tmp_path):
    """Answers above 64 KiB come back from the worker as a memfd, not through the socket."""
    (tmp_path / "main.py").write_text(
        "def handler(request, context):\n"
        "    size = int(request.query['size'])\n"
        "    content = bytes(range(256)) * (size // 256)\n"
        "    return {'content_type': 'application/octet-stream', 'content': content}\n"
    )
    server = make_server(tmp_path)
    for size in (64 * 1024, 64 * 1024 + 256, 3 * 1024 * 1024):
        answer = server.request("GET", f"/?size={size}")
        assert answer.status == 200
        assert answer.body == bytes(range(256)) * (size // 256)
