"""ABEJA Platform's async requests (contract Part B 1.8), against a stand-in platform API.

The stand-in is a real HTTP server on 127.0.0.1 that records every PUT (and answers with the
statuses a test queues); the runtime is pointed at it with ``ABEJA_API_URL``.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import multipart
import pytest
from helpers.otlp import otlp_http_receiver
from helpers.servers import RunningServer, ServerFactory
from helpers.waiting import wait_until

ASYNC = {"x-abeja-arms-async-request-id": "job-1", "x-abeja-arms-async-request-token": "t0k"}
PLATFORM = {"ABEJA_ORGANIZATION_ID": "org1", "ABEJA_DEPLOYMENT_ID": "dep1"}
RESULT_PATH = "/organizations/org1/deployments/dep1/results/job-1"


@dataclass
class Put:
    path: str
    headers: dict[str, str]
    body: bytes

    def parts(self) -> dict[str, tuple[dict[str, str], bytes]]:
        """The multipart parts by name, in order: their headers (lower-case) and bytes."""
        boundary = multipart.parse_options_header(self.headers["content-type"])[1]["boundary"]
        found = {}
        for part in multipart.MultipartParser(io.BytesIO(self.body), boundary):
            headers = {name.lower(): value for name, value in part.headerlist}
            found[part.name] = (headers, part.raw)
        return found


@dataclass
class PlatformApi:
    """Records PUTs; answers each with the next queued status (200 when none is queued)."""

    port: int = 0
    puts: list[Put] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def wait_for_puts(self, count: int) -> list[Put]:
        def enough() -> list[Put] | None:
            with self.lock:
                return list(self.puts) if len(self.puts) >= count else None

        return wait_until(enough, 15, f"{count} PUT(s) to the platform API")


@pytest.fixture
def platform_api() -> Iterator[PlatformApi]:
    api = PlatformApi()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            headers = {name.lower(): value for name, value in self.headers.items()}
            with api.lock:
                api.puts.append(Put(self.path, headers, body))
                status = api.statuses.pop(0) if api.statuses else 200
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    api.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield api
    server.shutdown()
    server.server_close()
    thread.join(10)


def start(
    make_server: ServerFactory, api: PlatformApi, *flags: str, env: dict[str, str] | None = None
) -> RunningServer:
    env = {**PLATFORM, "ABEJA_API_URL": f"http://127.0.0.1:{api.port}", **(env or {})}
    return make_server("as_jobs", *flags, env=env)


def test_an_async_request_gets_202_at_once_and_its_result_is_put_to_the_platform(
    make_server, platform_api
):
    server = start(make_server, platform_api)
    sync = server.post_json({"x": 1}, headers=ASYNC | {"x-abeja-arms-async-request-id": ""})

    answer = server.post_json({"x": 1}, path="/?hang=0.3", headers=ASYNC)
    (put,) = platform_api.wait_for_puts(1)
    parts = put.parts()

    assert answer.status == 202
    assert answer.body == b""
    assert answer.headers["Content-Type"] == "application/json"
    assert answer.headers["Connection"] == "close"
    assert put.path == RESULT_PATH
    assert put.headers["authorization"] == "Bearer t0k"
    assert put.headers["content-type"].startswith("multipart/form-data; boundary=")
    assert list(parts) == ["status", "headers", "body"]
    status_headers, status = parts["status"]
    assert status == b"200"
    assert status_headers["content-disposition"] == "form-data; name=status"  # as ABEJA Platform
    assert status_headers["content-type"] == "text/plain"
    result_headers = json.loads(parts["headers"][1])
    assert parts["headers"][0]["content-type"] == "application/json"
    assert result_headers["Content-Type"] == "application/json"
    assert result_headers["x-model"] == "m1"
    assert "x-abeja-sys-meta-runtime-version" in result_headers
    assert not {name.lower() for name in result_headers} & {"content-length"}
    assert parts["body"][0]["content-type"] == "application/json"
    # The handler saw the async headers like any other; a sync request got the same answer.
    assert json.loads(parts["body"][1]) == {"async_id": "job-1", "token": "t0k", "body": {"x": 1}}
    assert sync.status == 200
    assert sync.json() == {"async_id": "", "token": "t0k", "body": {"x": 1}}


def test_an_async_request_is_traced_until_its_result_is_sent(make_server, platform_api):
    """The server span ends at the 202, before the call runs: the job has a span of its own,
    a child of it, until the result is sent, and the call's queue wait and handler span are
    the job's children."""
    pytest.importorskip("opentelemetry.sdk", reason="traces need the otel extra")
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    with otlp_http_receiver() as receiver:
        server = start(
            make_server,
            platform_api,
            env={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "50"},
        )
        headers = ASYNC | {"traceparent": f"00-{trace_id}-{parent}-01"}
        answer = server.post_json({"x": 1}, headers=headers)
        platform_api.wait_for_puts(1)
        spans = receiver.wait_for(trace_id, {"POST", "async request", "queue wait", "handler"})

    assert answer.status == 202
    call, job = spans["POST"], spans["async request"]
    assert (call.parent_span_id, call.attributes["http.response.status_code"]) == (parent, 202)
    assert job.parent_span_id == call.span_id
    assert job.attributes["abeja.async_request_id"] == "job-1"
    assert job.attributes["http.response.status_code"] == 200  # the result's
    assert spans["queue wait"].parent_span_id == job.span_id
    assert spans["handler"].parent_span_id == job.span_id
    assert spans["handler"].end_ns <= job.end_ns  # the job ends once its result is sent


def test_a_streamed_answer_is_sent_whole(make_server, platform_api):
    server = start(make_server, platform_api)
    sync = server.request("GET", "/?stream=1")

    assert server.request("GET", "/?stream=1", headers=ASYNC).status == 202
    (put,) = platform_api.wait_for_puts(1)
    headers, body = put.parts()["body"]

    assert headers["content-type"] == "text/plain"
    assert body == sync.body == b"line 0\nline 1\nline 2\n"  # each streamed line ends


def test_a_failing_handler_sends_abejas_failure_document(make_server, platform_api):
    server = start(make_server, platform_api)
    assert server.request("GET", "/?fail=1", headers=ASYNC).status == 202
    (put,) = platform_api.wait_for_puts(1)

    assert put.headers["content-type"] == "application/json"
    assert put.headers["authorization"] == "Bearer t0k"
    assert put.body.decode() == json.dumps(
        {
            "status": 502,
            "headers": {"content-type": "application/json"},
            "body": {
                "error": "internal_server_error",
                "error_description": "Internal Server Error: unexpected error of response "
                "from runtime",
            },
        },
        indent=2,
    )
    logged = server.wait_for_record(
        lambda r: r.get("message", "").startswith("unexpected error occurred in the handler")
    )
    assert "the model failed" in json.dumps(logged)


def test_a_handler_past_its_deadline_sends_its_504(make_server, platform_api):
    server = start(make_server, platform_api, "--timeout", "1")
    assert server.request("GET", "/?hang=2", headers=ASYNC).status == 202
    (put,) = platform_api.wait_for_puts(1)
    parts = put.parts()
    assert parts["status"][1] == b"504"
    assert json.loads(parts["body"][1])["status"].startswith("handler timed out after 1 s")


@pytest.mark.parametrize("keyed", [False, True], ids=["by header", "by api key"])
def test_an_async_job_is_its_requests_tenants(make_server, platform_api, keyed):
    tenant = hashlib.sha256(b"k-gold").hexdigest()[:8] if keyed else "gold"  # a key's: its hash
    flags = ["--tenant-weights", f"{tenant}=2", "--tenant-header"]
    flags += ["api-key", "--api-keys", "k-gold"] if keyed else ["x-tenant"]
    caller = {"X-API-Key": "k-gold"} if keyed else {"x-tenant": "gold"}
    server = start(make_server, platform_api, *flags)
    answer = server.post_json({"x": 1}, headers=ASYNC | caller)
    assert answer.status == 202
    (put,) = platform_api.wait_for_puts(1)
    assert put.parts()["status"][1] == b"200"
    # Counted under its tenant's name, not as "other" (once its result is sent: waited for).
    counted = f'tenant_served_requests_total{{tenant="{tenant}"}} 1.0'
    wait_until(
        lambda: (
            counted in server.request("GET", "/metrics", port=server.healthcheck_port).body.decode()
        ),
        10,
        "the job counted under its tenant",
    )


def test_the_result_is_retried_on_errors_but_not_after_429(make_server, platform_api):
    server = start(make_server, platform_api)
    platform_api.statuses[:] = [500, 503]
    assert server.request("GET", "/", headers=ASYNC).status == 202
    puts = platform_api.wait_for_puts(3)  # two errors, then 200
    assert [put.path for put in puts] == [RESULT_PATH] * 3
    server.wait_for_record(
        lambda r: "sent status 200 of async request job-1" in r.get("message", "")
    )

    platform_api.statuses[:] = [429]
    second = {**ASYNC, "x-abeja-arms-async-request-id": "job-2"}
    assert server.request("GET", "/", headers=second).status == 202
    failed = server.wait_for_record(lambda r: "could not send" in r.get("message", ""))
    assert "job-2" in failed["message"] and "429" in failed["message"]
    assert len(platform_api.puts) == 4  # the 429 was not retried


def test_refused_async_requests_with_big_bodies_leave_nothing_held(make_server, platform_api):
    """A refused async request gives back what its body held: more refusals than the front
    reads bodies at a time (5), then a request with a big body is still served."""
    server = start(make_server, platform_api)
    big = json.dumps({"x": 1, "pad": "p" * 100_000}).encode()
    refused = {**ASYNC, "x-abeja-arms-async-request-id": "a/b", "Content-Type": "application/json"}
    for _ in range(20):
        assert server.request("POST", "/", big, refused, timeout=10).status == 400
    served = server.request("POST", "/", big, {"Content-Type": "application/json"}, timeout=10)
    assert served.status == 200


@pytest.mark.parametrize("async_id", ["../../../../admin/x", "a?injected=1", "a/b", ".", "x" * 129])
def test_an_async_id_that_is_not_one_path_segment_is_refused(make_server, platform_api, async_id):
    server = start(make_server, platform_api)
    answer = server.post_json({"x": 1}, headers=ASYNC | {"x-abeja-arms-async-request-id": async_id})
    assert answer.status == 400
    assert "x-abeja-arms-async-request-id must be 1 to 128 letters" in answer.json()["status"]
    fine = server.post_json({"x": 1}, headers=ASYNC | {"x-abeja-arms-async-request-id": "a.b_c-9"})
    assert fine.status == 202
    (put,) = platform_api.wait_for_puts(1)
    assert put.path == RESULT_PATH.replace("job-1", "a.b_c-9")


def test_async_requests_without_the_platform_api_settings_are_refused_clearly(make_server):
    server = make_server("as_jobs", env={"ABEJA_ORGANIZATION_ID": "org1"})
    answer = server.request("GET", "/", headers=ASYNC)
    assert answer.status == 501
    message = answer.json()["status"]
    assert "ABEJA_API_URL" in message and "ABEJA_DEPLOYMENT_ID" in message
    assert "ABEJA_ORGANIZATION_ID" not in message
    assert server.request("GET", "/").status == 200  # sync requests are served as ever


def test_a_graceful_shutdown_sends_the_results_still_pending(make_server, platform_api):
    server = start(make_server, platform_api)
    assert server.request("GET", "/?hang=1", headers=ASYNC).status == 202

    assert server.stop() == 0
    (put,) = platform_api.wait_for_puts(1)
    assert put.parts()["status"][1] == b"200"
