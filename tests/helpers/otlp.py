"""A real OTLP trace receiver on 127.0.0.1, over HTTP (protobuf) or gRPC, that decodes what it
gets with OpenTelemetry's own protobuf messages (``opentelemetry-proto``)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from typing import Any

from helpers.waiting import wait_until

__all__ = [
    "AwayReceiver",
    "ReceivedSpan",
    "Receiver",
    "away_otlp_http_receiver",
    "otlp_grpc_receiver",
    "otlp_http_receiver",
]


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    status_code: int  # 0 unset, 1 ok, 2 error
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)
    resource: dict[str, Any] = field(default_factory=dict)


def _value(any_value: Any) -> Any:
    return (
        getattr(any_value, any_value.WhichOneof("value")) if any_value.WhichOneof("value") else None
    )


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


class Receiver:
    """The spans received so far (thread-safe), and waits on them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[ReceivedSpan] = []
        self.endpoint = ""
        self.exports = 0

    def take(self, data: bytes) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        request = ExportTraceServiceRequest()
        request.ParseFromString(data)
        found = []
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    found.append(
                        ReceivedSpan(
                            span.name,
                            span.trace_id.hex(),
                            span.span_id.hex(),
                            span.parent_span_id.hex(),
                            span.kind,
                            span.status.code,
                            span.start_time_unix_nano,
                            span.end_time_unix_nano,
                            _attributes(span.attributes),
                            resource,
                        )
                    )
        with self._lock:
            self._spans.extend(found)
            self.exports += 1

    def spans(self, trace_id: str | None = None) -> list[ReceivedSpan]:
        with self._lock:
            return [s for s in self._spans if trace_id is None or s.trace_id == trace_id]

    def wait_for(
        self, trace_id: str, names: set[str], timeout: float = 30.0
    ) -> dict[str, ReceivedSpan]:
        """The spans of ``trace_id`` by name, once every one of ``names`` has come."""

        def arrived() -> dict[str, ReceivedSpan] | None:
            by_name = {span.name: span for span in self.spans(trace_id)}
            return by_name if names <= by_name.keys() else None

        return wait_until(arrived, timeout, f"the spans {sorted(names)} of trace {trace_id}")


@contextmanager
def otlp_http_receiver() -> Iterator[Receiver]:
    """OTLP/HTTP: ``POST /v1/traces`` with an ``ExportTraceServiceRequest`` (the benchmark's
    sink, told to decode what it takes)."""
    from benchmarks.otlp_sink import otlp_sink

    receiver = Receiver()
    with otlp_sink(receiver.take) as endpoint:
        receiver.endpoint = endpoint
        yield receiver


class AwayReceiver(Receiver):
    """An OTLP/HTTP receiver that is away until :meth:`arrive`: its port is bound but not
    listening, so that a connection to it is refused (as to a collector that is not running),
    and no other server can take the port meanwhile."""

    def __init__(self) -> None:
        from benchmarks.otlp_sink import sink_handler

        super().__init__()
        self._server = ThreadingHTTPServer(
            ("127.0.0.1", 0), sink_handler(self.take), bind_and_activate=False
        )
        self._server.server_bind()
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._serving = threading.Thread(target=self._server.serve_forever, daemon=True)

    def arrive(self) -> None:
        """Listen on the port, and take exports from now on."""
        self._server.server_activate()
        self._serving.start()

    def close(self) -> None:
        if self._serving.is_alive():
            self._server.shutdown()
            self._serving.join(10)
        self._server.server_close()


@contextmanager
def away_otlp_http_receiver() -> Iterator[AwayReceiver]:
    """An OTLP/HTTP receiver that refuses connections until its ``arrive()``."""
    receiver = AwayReceiver()
    try:
        yield receiver
    finally:
        receiver.close()


@contextmanager
def otlp_grpc_receiver() -> Iterator[Receiver]:
    """OTLP/gRPC: the ``TraceService/Export`` method, on a real grpcio server."""
    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    receiver = Receiver()

    class Service(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request: Any, context: Any) -> Any:
            receiver.take(request.SerializeToString())
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    receiver.endpoint = f"http://127.0.0.1:{port}"
    try:
        yield receiver
    finally:
        server.stop(None).wait(10)
