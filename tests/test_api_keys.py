"""API keys (``--api-keys``, ``--api-keys-file``): every way in (the direct path, aiohttp's, gRPC)
serves only a caller that sends a key given, as ``Authorization: Bearer`` or ``X-API-Key``; the
health port and ``/health_check`` never ask; the access record names the caller by its key's
short hash, and no log line holds a key."""

from __future__ import annotations

import hashlib
import http.client
import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from helpers.grpc_calls import ASYNC_MODEL, with_grpc
from helpers.servers import RunningServer, ServerFactory
from helpers.waiting import wait_until

from abeja_runtime.config import Config
from abeja_runtime.front.api_keys import api_keys

KEYS = ("alpha-key-1f9c", "beta-key-77d0")
ENV = {"ABEJA_RUNTIME_API_KEYS": ",".join(KEYS)}
MISSING = (
    "this model asks for an API key: send it as `Authorization: Bearer KEY` or `X-API-Key: KEY`"
)
WRONG = "the API key sent is not one this model accepts; check the key"


def short_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:8]


def post(server: RunningServer, body: bytes, headers: dict[str, str]) -> tuple[int, Any, Any]:
    """(status, JSON answer, headers) of a POST on a fresh connection; chunked when asked."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        chunked = headers.pop("chunked", None) is not None
        connection.request("POST", "/", body=iter([body]) if chunked else body, headers=headers)
        answer = connection.getresponse()
        return answer.status, json.loads(answer.read()), answer.headers
    finally:
        connection.close()


def no_key_in_any_line(server: RunningServer) -> None:
    for line in server.lines:
        assert not [key for key in KEYS if key in line], line


@pytest.fixture(scope="module")
def keyed(make_module_server: ServerFactory) -> RunningServer:
    return make_module_server("sv_pid", env=ENV)


@pytest.mark.parametrize(
    "body",
    [b"{}", b"x" * (200 * 1024), "chunked"],
    ids=["small (direct path)", "200 KiB (read into shared memory)", "chunked (aiohttp's path)"],
)
def test_a_caller_without_a_key_given_is_answered_401_on_every_http_way_in(
    keyed: RunningServer, body: bytes | str
) -> None:
    data = b"{}" if body == "chunked" else body
    extra = {"chunked": "1"} if body == "chunked" else {}
    assert isinstance(data, bytes)
    for headers, message in (
        ({}, MISSING),
        ({"Authorization": "Bearer not-a-key"}, WRONG),
        ({"X-API-Key": KEYS[0][:-1]}, WRONG),
        ({"Authorization": f"Basic {KEYS[0]}"}, MISSING),  # not a bearer token
    ):
        status, answer, head = post(keyed, data, {**headers, **extra})
        assert (status, answer) == (401, {"status": message}), headers
        assert head["WWW-Authenticate"] == 'Bearer realm="abeja-runtime"'
    for headers in (
        {"Authorization": f"Bearer {KEYS[0]}"},
        {"authorization": f"bearer {KEYS[1]}"},
        {"X-API-Key": KEYS[1]},
    ):
        status, answer, _ = post(keyed, data, {**headers, **extra})
        assert status == 200 and "pid" in answer, headers
    no_key_in_any_line(keyed)


def test_health_checks_and_metrics_ask_for_no_key(keyed: RunningServer) -> None:
    assert keyed.health(port=keyed.port) == 200  # /health_check on the service port
    assert keyed.health() == 200
    assert keyed.request("GET", "/metrics", port=keyed.healthcheck_port).status == 200


def test_the_access_record_names_the_caller_by_its_key_s_hash_never_by_the_key(
    keyed: RunningServer,
) -> None:
    status, _, _ = post(keyed, b"{}", {"X-API-Key": KEYS[1], "X-Abeja-Request-Id": "key-record"})
    assert status == 200
    record = keyed.wait_for_record(
        lambda r: r.get("log_type") == "access_log" and r.get("request_id") == "key-record"
    )
    assert record["caller"] == short_hash(KEYS[1])
    assert keyed.wait_for_record(lambda r: r.get("message", "").startswith("API keys: "))[
        "message"
    ] == (
        "API keys: the service port and gRPC serve callers that send one of the 2 key(s) "
        "given; the health port and /health_check ask for none"
    )
    no_key_in_any_line(keyed)


def test_keys_from_a_file_as_a_kubernetes_secret_mounts_them(
    make_server: ServerFactory, tmp_path: Path
) -> None:
    keys = tmp_path / "api-keys"
    keys.write_text(f"# the model's callers\n{KEYS[0]}\n\n  {KEYS[1]}  \n")
    server = make_server("sv_pid", env={"ABEJA_RUNTIME_API_KEYS_FILE": str(keys)})
    assert post(server, b"{}", {})[0] == 401
    for key in KEYS:
        assert post(server, b"{}", {"X-API-Key": key})[0] == 200
    no_key_in_any_line(server)


def test_a_keys_file_is_read_again_when_it_changes_as_a_secret_rotates(
    make_server: ServerFactory, tmp_path: Path
) -> None:
    """The kubelet swaps a mounted Secret's files for new ones: the new key is served within a
    few seconds and the old one refused, without a restart. A file that then holds no key
    leaves the keys before in force, with one warning."""
    keys = tmp_path / "api-keys"
    keys.write_text(f"{KEYS[0]}\n")
    server = make_server("sv_pid", env={"ABEJA_RUNTIME_API_KEYS_FILE": str(keys)})
    assert post(server, b"{}", {"X-API-Key": KEYS[0]})[0] == 200
    assert post(server, b"{}", {"X-API-Key": KEYS[1]})[0] == 401

    def swap(text: str) -> None:
        fresh = tmp_path / "api-keys.new"
        fresh.write_text(text)
        fresh.replace(keys)  # a new file in its place, as the kubelet's swap gives

    swap(f"{KEYS[1]}\n")
    wait_until(
        lambda: post(server, b"{}", {"X-API-Key": KEYS[1]})[0] == 200, 20, "the new key served"
    )
    assert post(server, b"{}", {"X-API-Key": KEYS[0]})[0] == 401
    said = server.wait_for_record(lambda r: "again" in r.get("message", ""))
    assert said["message"] == f"read the API keys of {keys} again: 1 key(s) in force"

    swap("# the keys are being rotated\n")

    def warned() -> list[dict[str, Any]]:
        assert post(server, b"{}", {"X-API-Key": KEYS[1]})[0] == 200  # still in force
        return [r for r in server.records() if r.get("log_level") == "warning"]

    (warning,) = wait_until(warned, 20, "the warning of a file without keys")
    assert "holds no key" in warning["message"] and warning["message"].endswith(
        "the keys read before stay in force"
    )
    later = time.monotonic() + 2.5  # two more looks at the unchanged file, at least
    while time.monotonic() < later:
        warned()
    assert len(warned()) == 1  # said once, not at every look
    no_key_in_any_line(server)


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (None, "No such file or directory"),
        ("# nothing but a comment\n\n", "holds no key"),
    ],
)
def test_a_keys_file_that_gives_no_key_stops_the_start_with_a_sentence(
    make_server: ServerFactory, tmp_path: Path, content: str | None, said: str
) -> None:
    keys = tmp_path / "api-keys"
    if content is not None:
        keys.write_text(content)
    server = make_server(
        "sv_pid",
        env={"ABEJA_RUNTIME_API_KEYS_FILE": str(keys)},
        wait=False,
        ports=(0, 0),
    )
    assert server.wait_exit() == 1
    record = server.wait_for_record(lambda r: r.get("log_level") == "error")
    assert record["message"].startswith("cannot start: ") and said in record["message"]
    assert str(keys) in record["message"] and "ABEJA_RUNTIME_API_KEYS_FILE" in record["message"]


@pytest.mark.parametrize("given", [",", " ", " , ,"])
def test_a_keys_setting_that_gives_no_key_stops_the_start_with_a_sentence(
    make_server: ServerFactory, given: str
) -> None:
    """A Secret that renders empty into the variable leaves the port closed, as the file
    does: it once served every caller."""
    server = make_server("sv_pid", env={"ABEJA_RUNTIME_API_KEYS": given}, wait=False, ports=(0, 0))
    assert server.wait_exit() == 1
    record = server.wait_for_record(lambda r: r.get("log_level") == "error")
    assert record["message"].startswith("cannot start: ") and "holds no key" in record["message"]
    assert "ABEJA_RUNTIME_API_KEYS" in record["message"]


def test_without_keys_every_caller_is_served_and_the_start_says_so(
    make_server: ServerFactory,
) -> None:
    server = make_server("sv_pid")
    assert post(server, b"{}", {})[0] == 200
    record = server.wait_for_record(lambda r: r.get("log_type") == "access_log")
    assert "caller" not in record
    server.wait_for_record(
        lambda r: (
            r.get("message")
            == "no API key is asked: every caller that reaches the service port is served"
        )
    )


def test_grpc_asks_for_the_key_in_its_metadata(make_server: ServerFactory) -> None:
    grpc = pytest.importorskip("grpc")
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
    from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc as stubs

    server = with_grpc(make_server, "st_kserve_async", env={**ASYNC_MODEL, **ENV})
    server.wait_for_record(lambda r: r.get("message", "").startswith("serving gRPC on"))
    tensor = pb.ModelInferRequest.InferInputTensor(
        name="x", datatype="FP64", shape=[1], contents=pb.InferTensorContents(fp64_contents=[4.0])
    )
    request = pb.ModelInferRequest(model_name="model", inputs=[tensor])
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        infer = stubs.GRPCInferenceServiceStub(channel).ModelInfer
        for metadata in ((), (("authorization", "Bearer nope"),)):
            with pytest.raises(grpc.RpcError) as refused:
                infer(request, timeout=20, metadata=metadata)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        for metadata in ((("authorization", f"Bearer {KEYS[0]}"),), (("x-api-key", KEYS[1]),)):
            answer = infer(request, timeout=20, metadata=metadata)
            assert list(answer.outputs[0].contents.fp64_contents) == [8.0]
    no_key_in_any_line(server)


def test_a_key_header_that_is_not_utf_8_is_a_wrong_key(keyed: RunningServer) -> None:
    for name in (b"Authorization: Bearer \xff\xfe", b"X-API-Key: \xff"):
        with socket.create_connection(("127.0.0.1", keyed.port), timeout=30) as sock:
            sock.sendall(
                b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n" + name + b"\r\n\r\n{}"
            )
            status = sock.recv(65536).split(b"\r\n", 1)[0]
        assert status == b"HTTP/1.1 401 Unauthorized", status
    assert not [line for line in keyed.lines if "Traceback" in line]


def test_kserve_s_metrics_on_the_service_port_ask_for_the_key(make_server: ServerFactory) -> None:
    server = make_server("st_kserve_async", env={**ASYNC_MODEL, **ENV})
    assert server.request("GET", "/metrics").status == 401
    answer = server.request("GET", "/metrics", headers={"X-API-Key": KEYS[0]})
    assert answer.status == 200 and b"abeja_runtime_requests_total" in answer.body
    assert server.request("GET", "/metrics", port=server.healthcheck_port).status == 200


def test_a_keys_file_s_lines_comments_and_commas(tmp_path: Path) -> None:
    keys = tmp_path / "api-keys"
    keys.write_text("\ufeffone\n   # a comment, indented\ntwo, three\n\n", encoding="utf-8")
    config = Config(api_keys="four", api_keys_file=str(keys))
    given = api_keys(config)
    assert given is not None and len(given) == 4
    for key in ("one", "two", "three", "four"):
        assert given.caller({"x-api-key": key}) == short_hash(key)
    assert api_keys(Config()) is None
