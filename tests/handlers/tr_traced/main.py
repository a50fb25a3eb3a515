"""Makes a span of its own (``user work``) and logs inside it, then answers with the ids of
the span current while it ran; ``?fail=1`` raises (a 500), ``?sleep=S`` sleeps first, and
``?big=N`` adds a list of N numbers to the answer (its encoding takes a while); ``streamed``
answers three lines, a stream."""

import logging
import time

from opentelemetry import trace

tracer = trace.get_tracer("tests.traced")
log = logging.getLogger("traced")


def handler(request, context):
    query = request.query
    if "sleep" in query:
        time.sleep(float(query["sleep"]))
    current = trace.get_current_span().get_span_context()
    with tracer.start_as_current_span("user work"):
        log.warning("inside the handler")
    if query.get("fail"):
        raise RuntimeError("failed on purpose")
    return {
        "content_type": "application/json",
        "content": {
            "trace_id": f"{current.trace_id:032x}",
            "span_id": f"{current.span_id:016x}",
            "big": list(range(int(query.get("big", "0")))),
        },
    }


async def async_handler(request, context):
    return handler(request, context)


def batched(requests, context):
    return [handler(request, context) for request in requests]


def streamed(request, context):
    return {"content_type": "text/plain", "content": (f"line {i}\n".encode() for i in range(3))}
