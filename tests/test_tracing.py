"""OpenTelemetry traces, checked at a real OTLP receiver that decodes the protobuf it gets
(``helpers/otlp.py``): the server span and its parent, the queue wait, the handler span and
the handler's own spans below it, the caller's sampled flag, errors, the ids in the logs, gRPC
calls, both OTLP transports, and a configuration that cannot work. The queue-wait histogram
is here too: it is the same wait, counted."""

from __future__ import annotations

import http.client
import os
import secrets
import threading
from pathlib import Path
from typing import Any

import pytest
from helpers.metrics import scrape, total
from helpers.otlp import Receiver, away_otlp_http_receiver, otlp_grpc_receiver, otlp_http_receiver
from helpers.servers import RunningServer
from helpers.waiting import wait_until

pytest.importorskip("opentelemetry.sdk", reason="traces need the otel extra")

#: OTLP's SpanKind and StatusCode values.
SERVER, ERROR = 2, 2
CALL_SPANS = {"queue wait", "handler", "user work"}
#: A small request's decode and encode take microseconds: a span of their own only when they
#: take 0.1 ms or more (a big body, a big answer; or a loaded machine).
COSTLY_SPANS = {"decode request", "encode response"}


def exporting_to(receiver: Receiver, **extra: str) -> dict[str, str]:
    """The environment of a runtime that exports to ``receiver`` (spans sent every 50 ms)."""
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        **extra,
    }


def traceparent(sampled: bool = True) -> tuple[str, str, dict[str, str]]:
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    flags = "01" if sampled else "00"
    return trace_id, parent, {"traceparent": f"00-{trace_id}-{parent}-{flags}"}


@pytest.fixture(scope="module")
def receiver() -> Any:
    with otlp_http_receiver() as found:
        yield found


@pytest.fixture(scope="module")
def traced(make_module_server: Any, receiver: Receiver) -> RunningServer:
    return make_module_server(
        "tr_traced", "--handler", "main:handler", "--log-format", "json", "--timeout", "1",
        env=exporting_to(receiver),
    )  # fmt: skip


def chunked_post(server: RunningServer, path: str, headers: dict[str, str]) -> Any:
    """A POST whose body is chunked: aiohttp's path serves it, not the direct path."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        connection.request(
            "POST", path, body=iter([b"{", b"}"]), headers=headers, encode_chunked=True
        )
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


@pytest.mark.parametrize("way", ["direct", "aiohttp"])
def test_a_call_is_a_server_span_with_its_queue_wait_and_handler_below(
    traced: RunningServer, receiver: Receiver, way: str
) -> None:
    import json

    trace_id, parent, headers = traceparent()
    if way == "direct":
        answer = traced.request("POST", "/?a=1", b"{}", headers)
        status, body = answer.status, answer.body
    else:
        status, body = chunked_post(traced, "/?a=1", headers)
    assert status == 200, body
    spans = receiver.wait_for(trace_id, {"POST", *CALL_SPANS})
    server = spans["POST"]
    assert (server.parent_span_id, server.kind) == (parent, SERVER)
    assert server.attributes["http.response.status_code"] == 200
    assert server.attributes["url.path"] == "/"
    assert server.resource["service.name"] == "abeja-runtime"
    queue_wait, handler = spans["queue wait"], spans["handler"]
    assert queue_wait.parent_span_id == server.span_id
    assert handler.parent_span_id == server.span_id
    assert server.start_ns <= queue_wait.start_ns <= queue_wait.end_ns <= handler.start_ns
    assert handler.end_ns <= server.end_ns
    for name in COSTLY_SPANS & spans.keys():  # a small request's, when the machine was slow
        assert spans[name].parent_span_id == handler.span_id
    assert spans["user work"].parent_span_id == handler.span_id  # the handler's own span
    assert json.loads(body) == {"trace_id": trace_id, "span_id": handler.span_id, "big": []}
    access = traced.wait_for_record(
        lambda r: r.get("log_type") == "access_log" and r.get("trace_id") == trace_id
    )
    assert access["span_id"] == server.span_id
    logged = traced.wait_for_record(
        lambda r: r.get("message") == "inside the handler" and r.get("trace_id") == trace_id
    )
    assert logged["span_id"] == handler.span_id


def test_a_streamed_answer_s_span_has_its_time_to_first_chunk(
    make_server: Any, receiver: Receiver
) -> None:
    server = make_server("tr_traced", "--handler", "main:streamed", env=exporting_to(receiver))
    trace_id, _, headers = traceparent()
    answer = server.request("GET", "/", None, {**headers, "X-Abeja-Request-Id": "first-chunk"})
    assert answer.body == b"line 0\nline 1\nline 2\n"
    spans = receiver.wait_for(trace_id, {"GET"})
    first_chunk = spans["GET"].attributes["abeja.time_to_first_chunk_seconds"]
    record = server.wait_for_record(
        lambda r: r.get("log_type") == "access_log" and r.get("request_id") == "first-chunk"
    )
    assert record["chunks"] == 3
    # The first chunk went after the head, within the whole answer's time.
    elapsed = record["elapsed_microsecs"] / 1e6
    assert record["time_to_first_byte_microsecs"] / 1e6 <= first_chunk <= elapsed


def test_the_server_span_has_the_callers_deadline_tenant_and_priority(
    make_server: Any, receiver: Receiver
) -> None:
    server = make_server(
        "tr_traced", "--tenant-header", "x-tenant", "--priority-header", "x-priority",
        env=exporting_to(receiver),
    )  # fmt: skip
    trace_id, _, headers = traceparent()
    headers.update({"Request-Timeout": "20", "x-tenant": "team-a", "x-priority": "high"})
    assert server.request("GET", "/", None, headers).status == 200
    attributes = receiver.wait_for(trace_id, {"GET"})["GET"].attributes
    assert attributes["abeja.deadline"] == 20
    assert (attributes["abeja.tenant"], attributes["abeja.priority"]) == ("team-a", "high")


def test_a_costly_decode_and_encode_have_spans_of_their_own(
    traced: RunningServer, receiver: Receiver
) -> None:
    """A 4 MiB multipart part to spool, 200,000 numbers to encode: each takes milliseconds."""
    trace_id, _, headers = traceparent()
    boundary = "tracedboundary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.bin"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    )
    body = head.encode() + os.urandom(4 * 1024 * 1024) + f"\r\n--{boundary}--\r\n".encode()
    headers["Content-Type"] = f"multipart/form-data; boundary={boundary}"
    answer = traced.request("POST", "/?big=200000", body, headers)
    assert answer.status == 200, answer.body[:200]
    spans = receiver.wait_for(trace_id, {"POST", *CALL_SPANS, *COSTLY_SPANS})
    handler = spans["handler"]
    decode, encode = spans["decode request"], spans["encode response"]
    assert decode.parent_span_id == handler.span_id == encode.parent_span_id
    assert handler.start_ns <= decode.start_ns <= decode.end_ns <= spans["user work"].start_ns
    assert spans["user work"].end_ns <= encode.start_ns <= encode.end_ns <= handler.end_ns


@pytest.mark.parametrize(
    "flags",
    [("--handler", "main:async_handler"), ("--handler", "main:batched", "--max-batch-size", "4")],
)
def test_async_and_batched_handlers_have_their_handler_span(
    make_server: Any, receiver: Receiver, flags: tuple[str, ...]
) -> None:
    import json

    server = make_server("tr_traced", *flags, env=exporting_to(receiver))
    trace_id, _, headers = traceparent()
    answer = server.request("POST", "/", b"{}", headers)
    assert answer.status == 200, answer.body
    spans = receiver.wait_for(trace_id, {"POST", "queue wait", "handler", "user work"})
    handler = spans["handler"]
    assert handler.parent_span_id == spans["POST"].span_id
    assert spans["user work"].parent_span_id == handler.span_id
    assert json.loads(answer.body)["span_id"] == handler.span_id


def test_a_caller_that_did_not_sample_gets_no_spans(
    traced: RunningServer, receiver: Receiver
) -> None:
    unsampled, _, headers = traceparent(sampled=False)
    headers["x-abeja-request-id"] = request_id = secrets.token_hex(8)
    assert traced.request("POST", "/", b"{}", headers).status == 200
    # The next call's spans come after any of the first's, from each process.
    sampled, _, headers = traceparent()
    assert traced.request("POST", "/", b"{}", headers).status == 200
    receiver.wait_for(sampled, {"POST", *CALL_SPANS})
    assert receiver.spans(unsampled) == []
    access = traced.wait_for_record(
        lambda r: r.get("log_type") == "access_log" and r.get("request_id") == request_id
    )
    assert "trace_id" not in access  # no trace of it is kept to look it up in


def test_a_call_without_traceparent_starts_a_trace(
    traced: RunningServer, receiver: Receiver
) -> None:
    import json

    answer = traced.request("GET", "/?b=1")
    assert answer.status == 200
    trace_id = json.loads(answer.body)["trace_id"]
    spans = receiver.wait_for(trace_id, {"GET", *CALL_SPANS})
    assert spans["GET"].parent_span_id == ""


@pytest.mark.parametrize(("query", "status"), [("fail=1", 500), ("sleep=3", 504)])
def test_a_5xx_marks_the_server_span_as_an_error(
    traced: RunningServer, receiver: Receiver, query: str, status: int
) -> None:
    trace_id, _, headers = traceparent()
    assert traced.request("POST", f"/?{query}", b"{}", headers).status == status
    spans = receiver.wait_for(trace_id, {"POST", "handler"})
    assert spans["POST"].status_code == ERROR
    assert spans["POST"].attributes["http.response.status_code"] == status
    if status == 500:
        assert spans["handler"].status_code == ERROR


def test_health_checks_and_scrapes_have_no_spans(traced: RunningServer, receiver: Receiver) -> None:
    for port in (traced.port, traced.healthcheck_port):
        assert traced.request("GET", "/health_check", port=port).status == 200
    assert traced.request("GET", "/livez", port=traced.healthcheck_port).status == 200
    assert traced.request("GET", "/metrics", port=traced.healthcheck_port).status == 200
    trace_id, _, headers = traceparent()
    assert traced.request("POST", "/", b"{}", headers).status == 200
    receiver.wait_for(trace_id, {"POST", *CALL_SPANS})
    paths = {span.attributes.get("url.path") for span in receiver.spans()}
    assert paths.isdisjoint({"/health_check", "/livez", "/metrics"})


def test_spans_go_over_otlp_grpc_too(make_server: Any) -> None:
    pytest.importorskip("grpc")
    with otlp_grpc_receiver() as receiver:
        server = make_server(
            "tr_traced", env=exporting_to(receiver, OTEL_EXPORTER_OTLP_PROTOCOL="grpc")
        )
        trace_id, parent, headers = traceparent()
        assert server.request("POST", "/", b"{}", headers).status == 200
        spans = receiver.wait_for(trace_id, {"POST", *CALL_SPANS})
        assert spans["POST"].parent_span_id == parent


def test_a_grpc_call_is_traced_from_its_metadata(make_server: Any, receiver: Receiver) -> None:
    pytest.importorskip("kserve", reason="the gRPC protocol is KServe's; tested with its package")
    grpc = pytest.importorskip("grpc")
    from helpers.grpc_calls import ASYNC_MODEL, with_grpc
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
    from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc as stubs

    server = with_grpc(
        make_server, "st_kserve_async", env={**ASYNC_MODEL, **exporting_to(receiver)}
    )
    trace_id, parent, headers = traceparent()
    tensor = pb.ModelInferRequest.InferInputTensor(
        name="x", datatype="FP64", shape=[1], contents=pb.InferTensorContents(fp64_contents=[1.0])
    )
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stubs.GRPCInferenceServiceStub(channel).ModelInfer(
            pb.ModelInferRequest(model_name="model", inputs=[tensor]),
            metadata=tuple(headers.items()),
            timeout=30,
        )
    name = "inference.GRPCInferenceService/ModelInfer"
    spans = receiver.wait_for(trace_id, {name, "queue wait", "handler"})
    assert (spans[name].parent_span_id, spans[name].kind) == (parent, SERVER)
    assert spans[name].attributes["rpc.system"] == "grpc"
    assert spans["handler"].parent_span_id == spans[name].span_id


@pytest.mark.parametrize(
    "setting",
    [
        {"OTEL_TRACES_SAMPLER": "sometimes"},
        {"OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon"},
        {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"},
    ],
)
def test_a_configuration_that_cannot_work_is_one_warning_and_no_traces(
    make_server: Any, setting: dict[str, str]
) -> None:
    with otlp_http_receiver() as receiver:
        server = make_server(
            "tr_traced", "--log-format", "json", env=exporting_to(receiver, **setting)
        )
        headers = traceparent()[2]
        assert server.request("POST", "/", b"{}", headers).status == 200
        assert server.stop() == 0  # tracing on would export its spans at the stop
        warnings = [r for r in server.records() if "tracing is off" in r.get("message", "")]
        assert len(warnings) == 1, warnings
        assert warnings[0]["log_level"] == "warning"
        assert receiver.spans() == []


def test_a_collector_that_does_not_answer_holds_the_stop_no_longer_than_the_runtime_allows(
    make_server: Any,
) -> None:
    """Spans still buffered at the stop get SHUTDOWN_WAIT seconds to go out; a collector that
    accepts and never answers (and an exporter told to wait ten minutes for it) would hold each
    process's stop for OpenTelemetry's own 30 s. The front and its worker say what they drop,
    and the runtime stops with 0."""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as silent:  # connections wait in its backlog
        server = make_server(
            "tr_traced", "--log-format", "json",
            env={
                "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{silent.getsockname()[1]}",
                "OTEL_EXPORTER_OTLP_TIMEOUT": "600",
                "OTEL_BSP_SCHEDULE_DELAY": "600000",  # kept until the stop
            },
        )  # fmt: skip
        assert server.request("POST", "/", b"{}", traceparent()[2]).status == 200
        assert server.stop(timeout=120) == 0
    dropped = [r for r in server.records() if "were not all sent" in r.get("message", "")]
    assert len(dropped) == 2, dropped  # the front's server span, the worker's handler span
    assert all(r["log_level"] == "warning" for r in dropped)


def test_an_absent_collector_is_one_warning_per_process_and_one_line_when_it_comes(
    make_server: Any,
) -> None:
    """The front says at start that tracing is on, and where the spans go. While the collector
    cannot be reached, OpenTelemetry's exporter would log a warning at every retry of every
    batch, in every process: each process says once instead that its spans cannot be sent,
    naming the variable to set, and once that they are sent again when the collector comes."""
    with away_otlp_http_receiver() as receiver:
        server = make_server("tr_traced", "--log-format", "json", env=exporting_to(receiver))
        started = server.wait_for_record(lambda r: "tracing is on" in r.get("message", ""))
        assert started["log_level"] == "info"
        assert started["message"] == (
            "tracing is on: the front and each handler process send their spans over OTLP/HTTP "
            f"to {receiver.endpoint}/v1/traces (OTEL_EXPORTER_OTLP_ENDPOINT); sampler "
            "parentbased_always_on"
        )
        for _ in range(3):
            assert server.request("POST", "/", b"{}", traceparent()[2]).status == 200
        processes = ("the front ", "handler process ")

        def cannot_send(record: dict[str, Any]) -> bool:
            return "cannot send its spans" in record.get("message", "")

        def sent_again(record: dict[str, Any]) -> bool:
            return record.get("message", "").endswith(
                f"its spans to {receiver.endpoint}/v1/traces again"
            )

        for process in processes:
            server.wait_for_record(
                lambda r, by=process: cannot_send(r) and r["message"].startswith(by)
            )
        receiver.arrive()
        trace_id, _, headers = traceparent()
        assert server.request("POST", "/", b"{}", headers).status == 200
        receiver.wait_for(trace_id, {"POST", *CALL_SPANS})
        for process in processes:
            server.wait_for_record(
                lambda r, by=process: sent_again(r) and r["message"].startswith(by)
            )
    records = server.records()
    warned = [r for r in records if cannot_send(r)]
    assert len(warned) == 2, warned  # one per process: the front's, its handler process's
    for record in warned:
        assert record["log_level"] == "warning"
        assert f"cannot send its spans to {receiver.endpoint}/v1/traces" in record["message"]
        assert "Connection refused" in record["message"]  # the exporter's reason
        assert "set OTEL_EXPORTER_OTLP_ENDPOINT to where yours listens" in record["message"]
    assert [r["log_level"] for r in records if sent_again(r)] == ["info", "info"]
    # None of the exporter's own warnings: only ours, and the handler's own line.
    others = [
        r
        for r in records
        if r.get("log_level") in ("warning", "error")
        and not cannot_send(r)
        and r.get("message") != "inside the handler"
    ]
    assert others == []


def test_no_exporter_configured_is_no_tracing(make_server: Any) -> None:
    """No span anywhere: the handler runs under none, the access record names none."""
    import json

    server = make_server("tr_traced", "--log-format", "json")
    headers = traceparent()[2]
    answer = server.request("POST", "/", b"{}", headers)
    assert answer.status == 200
    assert json.loads(answer.body)["trace_id"] == "0" * 32  # OpenTelemetry's invalid span
    access = server.wait_for_record(lambda r: r.get("log_type") == "access_log")
    assert "trace_id" not in access
    assert not any("tracing" in r.get("message", "") for r in server.records())


def test_the_queue_wait_histogram_counts_each_call_across_workers(
    make_server: Any, tmp_path: Path
) -> None:
    import time

    server = make_server("ex_sleep", "--workers", "2", "--concurrency", "1")
    release = tmp_path / "release"
    answers: list[int] = []
    callers = [
        threading.Thread(
            target=lambda tag=tag: answers.append(
                server.request("GET", f"/?tag={tag}&until={release}", timeout=60).status
            )
        )
        for tag in range(3)
    ]
    for caller in callers:
        caller.start()
    # Two run, one waits in the queue; it waits at least from now until the release.
    wait_until(
        lambda: total(scrape(server), "abeja_runtime_queued_requests") == 1, 30, "a call queued"
    )
    queued_since = time.monotonic()
    wait_until(lambda: time.monotonic() - queued_since > 0.3, 5, "0.3 s of queue wait")
    release.touch()
    for caller in callers:
        caller.join(60)
    assert answers == [200, 200, 200]
    samples = scrape(server)
    name = "abeja_runtime_queue_wait_seconds"
    assert total(samples, f"{name}_count") == 3
    assert total(samples, f"{name}_bucket", le="0.25") <= 2  # the one that waited is above
    assert total(samples, f"{name}_sum") > 0.3
