"""OpenTelemetry traces of the runtime's calls (``pip install 'abeja-runtime[otel]'``).

Configured by OpenTelemetry's own variables, as every instrumented service is: tracing is on
when an exporter is configured (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, or ``OTEL_TRACES_EXPORTER`` naming ``otlp`` or
``console``), over OTLP/HTTP (protobuf, the default) or OTLP/gRPC
(``OTEL_EXPORTER_OTLP_PROTOCOL=grpc``), sampled as ``OTEL_TRACES_SAMPLER`` says (by default
the caller's decision: a ``traceparent`` whose sampled flag is 0 records nothing). Off
otherwise, or with ``OTEL_SDK_DISABLED=true``; a configuration that cannot work (an unknown
sampler or protocol, the packages missing) is one warning and off, never a failed start.

Each process has its own provider and exports its own spans: the front a **server span** per
call (its parent the caller's ``traceparent``; a 5xx or 504 marks it an error) and its
**queue wait** (from the call's arrival in the queue to its handler call: the wait no Python
peer shows); each handler process a **handler span**, child of the server span, whose context
is passed in the call frame (:attr:`~abeja_runtime.frames.Call.trace`), with a **decode**
span for the request and an **encode** span for the answer where they take 0.1 ms or more
(a small request's take microseconds: two spans for nothing). The handler
span is the current span while the handler runs, so that a handler's own spans are its
children, and its ids are in the handler's log records (as the server span's are in the
access record). ``/health_check``, ``/livez`` and ``/metrics`` have no spans: the front
answers them before a call begins.

When tracing is on, the front says so at start, with where the spans go and the sampler.
Each process says once when its spans cannot be sent (the collector is away, or refuses them),
and once when they are sent again: the SDK's exporter would log a warning at every retry of
every batch for as long as the collector is away (:class:`_ExportWatch`).

Nothing of OpenTelemetry is imported while tracing is off: the hot path pays one ``is None``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from contextvars import Token
from typing import TYPE_CHECKING, Any, Final, TypeVar

from abeja_runtime.logs import trace_ids_var

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

__all__ = [
    "COSTLY",
    "CallTrace",
    "HandlerSpan",
    "IfCostly",
    "Tracing",
    "carrier",
    "tracing_from",
]

_log = logging.getLogger("abeja_runtime")

#: The pairs a span's context travels in: W3C ``traceparent`` and ``tracestate`` (and
#: whatever else ``OTEL_PROPAGATORS`` adds, such as ``baggage``).
Carrier = tuple[tuple[str, str], ...]

_Encoded = TypeVar("_Encoded")
_EXPORTERS: Final = ("otlp", "console")
_PROTOCOLS: Final = ("http/protobuf", "grpc")
_SAMPLERS: Final = (
    "always_on", "always_off", "parentbased_always_on", "parentbased_always_off",
    "traceidratio", "parentbased_traceidratio",
)  # fmt: skip
_INSTALL: Final = "pip install 'abeja-runtime[otel]'"
#: Nanoseconds of decoding or encoding that make a span of their own (:class:`IfCostly`).
COSTLY: Final = 100_000
#: Seconds the spans still buffered get to go out when a process stops: a collector that does
#: not answer held the stop for OpenTelemetry's own bound, 30 s (beyond a pod's termination
#: grace, once the drain has had its share). Within the 5 s the front gives a worker beyond
#: its grace period, and the manifests' 5 s beyond the front's.
SHUTDOWN_WAIT: Final = 2.0


def _configuration_problem(environ: Mapping[str, str]) -> str | None:
    """What makes the ``OTEL_*`` configuration unusable, in a sentence; ``None`` when it can
    work."""
    exporter = environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
    if exporter not in _EXPORTERS:
        return (
            f"OTEL_TRACES_EXPORTER={exporter!r} is not an exporter the runtime has; use otlp "
            "or console (or none for no traces)"
        )
    protocol = _protocol(environ)
    if exporter == "otlp" and protocol and protocol not in _PROTOCOLS:
        return (
            f"the OTLP protocol {protocol!r} is not one the runtime exports with; set "
            "OTEL_EXPORTER_OTLP_PROTOCOL to http/protobuf or grpc"
        )
    sampler = environ.get("OTEL_TRACES_SAMPLER", "parentbased_always_on").strip().lower()
    if sampler not in _SAMPLERS:
        known = ", ".join(_SAMPLERS)
        return f"OTEL_TRACES_SAMPLER={sampler!r} is not a sampler; use one of {known}"
    if sampler.endswith("traceidratio"):
        argument = environ.get("OTEL_TRACES_SAMPLER_ARG", "1.0")
        try:
            ratio = float(argument)
        except ValueError:
            ratio = -1.0
        if not 0.0 <= ratio <= 1.0:
            return f"OTEL_TRACES_SAMPLER_ARG={argument!r} must be a ratio from 0 to 1"
    return None


def _wanted(environ: Mapping[str, str]) -> bool:
    """Whether traces are asked for: an exporter or an endpoint is configured."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    endpoints = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    return bool(exporter) or any(environ.get(name, "").strip() for name in endpoints)


def tracing_from(environ: Mapping[str, str], process: str) -> Tracing | None:
    """This process's tracing as ``environ`` configures it, or ``None`` (off). ``process``
    names it in the spans' resource (``front``, ``worker``). A configuration that cannot work
    is logged once (by the front) and leaves tracing off."""
    if not _wanted(environ):
        return None
    problem = _configuration_problem(environ)
    if problem is None:
        try:
            tracing = Tracing(environ, process)
        except ImportError:
            problem = f"the OpenTelemetry packages are not installed ({_INSTALL})"
        except Exception as exc:  # an exporter that rejects its settings (a bad endpoint)
            problem = f"OpenTelemetry could not be set up: {exc}"
        else:
            if process == "front":
                _log.info(
                    "tracing is on: the front and each handler process %s; sampler %s",
                    _destination(environ),
                    _sampler(environ),
                )
            return tracing
    if process == "front":
        _log.warning("tracing is off: %s", problem)
    return None


def _protocol(environ: Mapping[str, str]) -> str:
    """The OTLP protocol configured (empty: OpenTelemetry's default, http/protobuf)."""
    return environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "")
    ).strip()


def _endpoint(environ: Mapping[str, str]) -> tuple[str, str]:
    """Where the OTLP exporter sends, resolved as OpenTelemetry resolves it, and the variable
    that says so (``OTEL_EXPORTER_OTLP_ENDPOINT`` when neither is set: the one to set)."""
    traces = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if traces:
        return traces, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    base = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    if _protocol(environ) == "grpc":
        return base or "http://localhost:4317", "OTEL_EXPORTER_OTLP_ENDPOINT"
    base = base or "http://localhost:4318"
    return f"{base.removesuffix('/')}/v1/traces", "OTEL_EXPORTER_OTLP_ENDPOINT"


def _destination(environ: Mapping[str, str]) -> str:
    """Where the spans go, as the start-up line says it."""
    if environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "console":
        return "print their spans on stdout (OTEL_TRACES_EXPORTER=console)"
    transport = "OTLP/gRPC" if _protocol(environ) == "grpc" else "OTLP/HTTP"
    endpoint, variable = _endpoint(environ)
    return f"send their spans over {transport} to {endpoint} ({variable})"


def _sampler(environ: Mapping[str, str]) -> str:
    """The sampler, with its ratio where it takes one, as the start-up line says it."""
    sampler = environ.get("OTEL_TRACES_SAMPLER", "parentbased_always_on").strip().lower()
    if sampler.endswith("traceidratio"):
        return f"{sampler} ({environ.get('OTEL_TRACES_SAMPLER_ARG', '1.0')})"
    return sampler


def _exporter(environ: Mapping[str, str], process: str) -> Any:
    """The span exporter ``environ`` configures; an OTLP one is watched (:class:`_ExportWatch`)."""
    exporter = environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
    if exporter == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if _protocol(environ) == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return _ExportWatch(OTLPSpanExporter(), environ, process)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpSpanExporter,
    )

    return _ExportWatch(HttpSpanExporter(), environ, process)


class _ExportWatch(logging.Filter):
    """An OTLP exporter, watched: this process says once, in a warning, that its spans cannot
    be sent (with the exporter's first reason, and what to do), and once, in an info line,
    that they are sent again. The exporter's own warnings and errors (a warning at every retry
    of every batch while the collector is away) are kept out of the log: this filter is on
    its loggers. ``export`` is watched; the rest (``shutdown``, ``force_flush``) is the
    exporter's own."""

    def __init__(self, exporter: Any, environ: Mapping[str, str], process: str) -> None:
        super().__init__()
        from opentelemetry.sdk.trace.export import SpanExportResult

        self._exporter = exporter
        self._success = SpanExportResult.SUCCESS
        self._endpoint, self._variable = _endpoint(environ)
        self._process = process
        self._lock = threading.Lock()
        #: The spans could not be sent, and that was said; not yet sent again since.
        self._failing = False
        # Its loggers: each of its classes' modules logs as itself (``getLogger(__name__)``).
        for module in {kind.__module__ for kind in type(exporter).__mro__}:
            if module.startswith("opentelemetry.exporter."):
                logging.getLogger(module).addFilter(self)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._exporter, name)

    def _who(self) -> str:
        """This process, as the log names it (a process forked from the template has a pid of
        its own)."""
        return "the front" if self._process == "front" else f"handler process {os.getpid()}"

    def export(self, spans: Any) -> Any:
        result = self._exporter.export(spans)
        if result is self._success:
            self._sent()
        else:
            self._failed("")
        return result

    def filter(self, record: logging.LogRecord) -> bool:
        """Keep the exporter's debug and info records; its warnings and errors are said as one
        of ours."""
        if record.levelno < logging.WARNING:
            return True
        self._failed(record.getMessage())
        return False

    def _failed(self, reason: str) -> None:
        with self._lock:
            if self._failing:
                return
            self._failing = True
        said = f' (OpenTelemetry\'s exporter said: "{reason}")' if reason else ""
        _log.warning(
            "%s cannot send its spans to %s%s: they are dropped until an OTLP collector there "
            "takes them. Start one, or set %s to where yours listens (or unset it: no "
            "tracing). Said once, not at every retry.",
            self._who(),
            self._endpoint,
            said,
            self._variable,
        )

    def _sent(self) -> None:
        with self._lock:
            if not self._failing:
                return
            self._failing = False
        _log.info("%s sends its spans to %s again", self._who(), self._endpoint)


class Tracing:
    """One process's tracer provider, exporter and propagator (see the module)."""

    def __init__(self, environ: Mapping[str, str], process: str) -> None:
        from opentelemetry import context, propagate, trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        named = "OTEL_SERVICE_NAME" in environ or "service.name=" in environ.get(
            "OTEL_RESOURCE_ATTRIBUTES", ""
        )
        attributes = {} if named else {"service.name": "abeja-runtime"}
        attributes["abeja_runtime.process"] = process
        # No exit handler of its own: ours (shutdown) bounds the wait, and an exit handler
        # would wait again, unbounded in the SDK's older releases.
        self._provider: TracerProvider = TracerProvider(
            resource=Resource.create(attributes), shutdown_on_exit=False
        )
        self._provider.add_span_processor(BatchSpanProcessor(_exporter(environ, process)))
        if process == "worker":  # the handler's own spans go where the runtime's go
            trace.set_tracer_provider(self._provider)
        self.tracer: Tracer = self._provider.get_tracer("abeja_runtime")
        self._propagator = propagate.get_global_textmap()
        self._trace = trace
        self._context = context
        self._server = trace.SpanKind.SERVER
        self._error = trace.StatusCode.ERROR
        #: A call could not be traced (said once).
        self._call_failed = False

    # -- the front --------------------------------------------------------------------------

    def call(
        self, carrier: Any, received: float, method: str, path: str, request_id: str, *, rpc: bool
    ) -> CallTrace | None:
        """A call's server span, from ``received`` (seconds since the epoch), its parent the
        caller's context in ``carrier`` (request headers, gRPC metadata as a mapping), named
        and described as OpenTelemetry's conventions for HTTP and gRPC servers say (``rpc``:
        ``path`` is the gRPC method). ``None`` when it cannot be made: the call is served, and
        counted, untraced (the first such failure is logged)."""
        name, attributes = _server_span(method, path, request_id, rpc)
        try:
            parent = self._propagator.extract(carrier) if carrier else None
            span = self.tracer.start_span(
                name,
                context=parent,
                kind=self._server,
                attributes=attributes,
                start_time=int(received * 1e9),
            )
        except Exception:  # a propagator or sampler of OTEL_PROPAGATORS/_SAMPLER that failed:
            # the call goes on untraced, and is counted like any other (its access record)
            if not self._call_failed:
                self._call_failed = True
                _log.warning("a call could not be traced; it is served untraced", exc_info=True)
            return None
        return CallTrace(self, span)

    # -- a handler process ------------------------------------------------------------------

    def handler(self, carrier: Carrier, name: str) -> HandlerSpan | None:
        """The handler span of a call whose server span's context is ``carrier``, from now
        (``None`` for a call the front did not trace)."""
        if not carrier:
            return None
        parent = self._propagator.extract(dict(carrier))
        caller = self._trace.get_current_span(parent)
        if not caller.get_span_context().trace_flags.sampled:
            # Nothing of it is recorded: the caller's span (which records nothing) stands for
            # the handler span, and the handler's own spans are its children, unrecorded too.
            return HandlerSpan(self, caller)
        attributes: dict[str, Any] = {"code.function": name, "process.pid": os.getpid()}
        return HandlerSpan(self, self.tracer.start_span("handler", parent, attributes=attributes))

    def encoding(self, encode: Callable[[Any], _Encoded]) -> Callable[[Any], _Encoded]:
        """``encode`` (a handler's result → its answer) in an ``encode response`` span, a
        child of the call's handler span (current while it runs)."""

        def traced(result: Any) -> _Encoded:
            with IfCostly(self, "encode response"):
                return encode(result)

        return traced

    def shutdown(self) -> None:
        """Export what is still buffered (at the process's end), for :data:`SHUTDOWN_WAIT`
        seconds at most; what is left then is dropped, with a warning."""
        export = threading.Thread(
            target=self._provider.shutdown, name="tracing-shutdown", daemon=True
        )
        export.start()
        export.join(SHUTDOWN_WAIT)
        if export.is_alive():
            _log.warning(
                "the spans still buffered were not all sent within %g s (the collector did not "
                "answer in time); the rest are dropped",
                SHUTDOWN_WAIT,
            )


def _server_span(method: str, path: str, request_id: str, rpc: bool) -> tuple[str, dict[str, str]]:
    """A server span's name and attributes."""
    if rpc:  # "/inference.GRPCInferenceService/ModelInfer"
        service, _, function = path.lstrip("/").partition("/")
        return path.lstrip("/"), {
            "rpc.system": "grpc", "rpc.service": service, "rpc.method": function,
            "abeja.request_id": request_id,
        }  # fmt: skip
    return method, {"http.request.method": method, "url.path": path, "abeja.request_id": request_id}


class CallTrace:
    """One call's spans in the front: its server span, and its queue wait as a child."""

    __slots__ = ("_span", "_tracing", "ids")

    def __init__(self, tracing: Tracing, span: Span) -> None:
        self._tracing = tracing
        self._span = span
        context = span.get_span_context()
        #: The trace and span ids, as the access record shows them (hex); none for a call
        #: that is not sampled (no trace of it is kept anywhere to look them up in).
        self.ids = _hex_ids(context) if context.trace_flags.sampled else None

    def carrier(self) -> Carrier:
        """The server span's context as the handler process gets it (in the call frame)."""
        tracing = self._tracing
        found: dict[str, str] = {}
        tracing._propagator.inject(found, tracing._trace.set_span_in_context(self._span))
        return tuple(found.items())

    def job(self, async_id: str) -> CallTrace:
        """The span of an async request's job (ABEJA's ARMS), a child of this server span, from
        now until its result is sent: the server span ends at the ``202``, before the call
        runs, so the call's queue wait and handler span hang from this one."""
        tracing = self._tracing
        span = tracing.tracer.start_span(
            "async request",
            context=tracing._trace.set_span_in_context(self._span),
            attributes={"abeja.async_request_id": async_id},
        )
        return CallTrace(tracing, span)

    def queue_wait(self, seconds: float) -> None:
        """The call left the queue for its handler call after ``seconds`` there."""
        span = self._span
        if not span.is_recording():
            return
        now = time.time_ns()
        child = self._tracing.tracer.start_span(
            "queue wait",
            context=self._tracing._trace.set_span_in_context(span),
            start_time=now - int(seconds * 1e9),
        )
        child.end(end_time=now)

    def first_chunk(self, seconds: float) -> None:
        """A streamed answer's first chunk went ``seconds`` after its request came."""
        self._span.set_attribute("abeja.time_to_first_chunk_seconds", seconds)

    def attribute(self, name: str, value: str | float) -> None:
        """An attribute of the server span (what the access record notes of the call)."""
        self._span.set_attribute(name, value)

    def status(self, status: int) -> None:
        """The answer's status (a gRPC call's as the access log counts it); a 5xx (504 too)
        marks the span as an error."""
        _answered(self._tracing, self._span, status)

    def end(self) -> None:
        self._span.end()


def _hex_ids(context: Any) -> tuple[str, str]:
    """A span's trace and span ids as the logs show them (hex)."""
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


def _answered(tracing: Tracing, span: Span, status: int) -> None:
    """The answer's status on ``span``; a 5xx (504 too) marks it as an error."""
    span.set_attribute("http.response.status_code", status)
    if status >= 500:
        span.set_status(tracing._error, f"answered {status}")


def carrier(trace: CallTrace | None) -> Carrier:
    """The context a call's spans in the handler process hang from, for its frame (empty: the
    call is not traced)."""
    return () if trace is None else trace.carrier()


class IfCostly:
    """A piece of a call's work that becomes a span (a child of the current one) only when it
    took :data:`COSTLY` or more: a small request's decode and encode take microseconds, and
    their two spans would cost more than the work they show."""

    __slots__ = ("_name", "_start", "_tracing")

    def __init__(self, tracing: Tracing, name: str) -> None:
        self._tracing = tracing
        self._name = name
        self._start = 0

    def __enter__(self) -> None:
        self._start = time.time_ns()

    def __exit__(self, *exc_info: object) -> None:
        end = time.time_ns()
        tracing = self._tracing
        # Under a span that records only (not a warm-up's call, not an unsampled one).
        if end - self._start >= COSTLY and tracing._trace.get_current_span().is_recording():
            tracing.tracer.start_span(self._name, start_time=self._start).end(end_time=end)


class HandlerSpan:
    """A call's handler span in its handler process: current while the handler runs (its own
    spans are children), its ids in the handler's log records."""

    __slots__ = ("_ended", "_ids_token", "_span", "_token", "_tracing")

    def __init__(self, tracing: Tracing, span: Span) -> None:
        self._tracing = tracing
        self._span = span
        self._ended = False
        self._token: Token[Context] | None = None
        self._ids_token: Token[tuple[str, str] | None] | None = None

    def __enter__(self) -> HandlerSpan:
        tracing = self._tracing
        self._token = tracing._context.attach(tracing._trace.set_span_in_context(self._span))
        context = self._span.get_span_context()
        if context.trace_flags.sampled:
            self._ids_token = trace_ids_var.set(_hex_ids(context))
        return self

    def decode(self) -> IfCostly:
        """Building the request (its body read, its parts spooled), a child span when it
        costs anything."""
        return IfCostly(self._tracing, "decode request")

    def status(self, status: int) -> None:
        _answered(self._tracing, self._span, status)

    def end(self) -> None:
        """The span ends now: before the call's last frame goes to the front, so that it ends
        within the front's server span, which ends once that frame is in. Its context is left
        later (``__exit__``), in the order the calls' spans were entered."""
        if not self._ended:
            self._ended = True
            self._span.end()

    def __exit__(self, *exc_info: object) -> None:
        if self._ids_token is not None:
            trace_ids_var.reset(self._ids_token)
        if self._token is not None:
            self._tracing._context.detach(self._token)
        self.end()
