"""The front's access log: one record per request, formatted cheaply and written in batches.

Text logs (``--log-format text``, for a person at a terminal) take a plain path instead: one
ordinary record per request, written at once.

Only the front (and ``abeja-runtime batch``) imports this module: it needs an event loop, and
asyncio costs a handler process 5 MiB it would otherwise not load (the ssl module).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from typing import Any, Final, NamedTuple

from abeja_runtime.limits import ALLOWED_METHODS
from abeja_runtime.logs import access_logger, encode_record, logs_text, utc_seconds

__all__ = ["AccessLog", "StreamedBody"]


class StreamedBody(NamedTuple):
    """How an answer written at its client's pace went (a stream, or a big body written from
    its file): when its first byte left, how it ended (``complete``, ``client_left``,
    ``failed``, ``worker_lost``, ``idle``, ``too_long``), the body's bytes written, and a
    stream's chunks (``None``: a body written from its file)."""

    first_byte: float
    end: str
    bytes_sent: int
    chunks: int | None = None


class AccessLog:
    """One access record per request, written in batches.

    It is the hottest log path by far: a ``LogRecord`` per request cost 20-30 % of serving a
    small JSON request, and a dict through the JSON encoder another 10 %. Each record is one
    ``%``-format of a template built once (keys sorted as the encoder sorts them, the static
    fields encoded already), and the records of a batch go out as one pre-formatted record,
    through the same handlers and lock as every other record, so lines never interleave.
    """

    def __init__(self, static_fields: dict[str, str] | None = None, *, every: float = 0.0) -> None:
        """``every``: seconds between writes; 0 writes at the end of each event-loop iteration.
        Whoever keeps records for a while calls :meth:`flush` before the loop ends."""
        static = static_fields or {}
        self._plain = _access_template(static, with_requester=False)
        self._with_requester = _access_template(static, with_requester=True)
        #: The fields every record has, for the records made as a dict (:meth:`_rare_line`).
        self._constants = {**_ACCESS_CONSTANTS, **static}
        self._every = every
        self._pending: list[str] = []
        self._last_second = -1
        self._last_text = ""
        #: Decided once: logging is configured before the server that records is made.
        self._text = logs_text()
        self._enabled = access_logger.isEnabledFor(logging.INFO)

    def record(
        self,
        method: str,
        path: str,
        status: int,
        received: float,
        responded: float,
        request_id: str,
        requester_id: str | None = None,
        streamed: StreamedBody | None = None,
        trace_ids: tuple[str, str] | None = None,
        noted: Mapping[str, Any] | None = None,
    ) -> None:
        """``path`` is the URL path without the query (which may carry what logs must not);
        ``streamed``, for an answer written at its client's pace and recorded at its end, how
        it went; ``trace_ids``, for a traced call, its trace's and server span's ids;
        ``noted``, what else its way in or its admission noted of it (``caller``: with API keys
        on, the short hash of the caller's key; ``deadline``: the seconds its caller gave)."""
        if not self._enabled:
            return
        if self._text:
            _record_text(
                method, path, status, received, responded, request_id, requester_id, streamed,
                trace_ids, noted,
            )  # fmt: skip
            return
        if streamed is not None or trace_ids is not None or noted is not None:
            self._pend(
                self._rare_line(
                    method, path, status, received, responded, request_id, requester_id,
                    streamed, trace_ids, noted,
                )
            )  # fmt: skip
            return
        # Whole microseconds since the epoch: exact integers from here on (no clamping of a
        # fraction that rounds up to a whole second).
        received_us = int(received * 1_000_000)
        responded_us = int(responded * 1_000_000)
        received_second, received_fraction = divmod(received_us, 1_000_000)
        responded_second, responded_fraction = divmod(responded_us, 1_000_000)
        elapsed = responded_us - received_us
        request_seconds = self._second(received_second)
        response_seconds = self._second(responded_second)
        method = _QUOTED_METHODS.get(method) or _json_string(method)
        path = _json_string(path)
        request_id = _json_string(request_id)
        milliseconds = responded_fraction // 1000  # the record's own timestamp
        if requester_id is None:
            line = self._plain % (
                elapsed, method, path, status, request_id, request_seconds, received_fraction,
                response_seconds, responded_fraction, response_seconds, milliseconds,
            )  # fmt: skip
        else:
            line = self._with_requester % (
                elapsed, method, path, status, request_id, request_seconds, received_fraction,
                _json_string(requester_id),
                response_seconds, responded_fraction, response_seconds, milliseconds,
            )  # fmt: skip
        self._pend(line)

    def _rare_line(
        self,
        method: str,
        path: str,
        status: int,
        received: float,
        responded: float,
        request_id: str,
        requester_id: str | None,
        streamed: StreamedBody | None,
        trace_ids: tuple[str, str] | None,
        noted: Mapping[str, Any] | None,
    ) -> str:
        """The record of a streamed answer (with ``time_to_first_byte_microsecs``,
        ``stream_end`` and ``bytes_sent``), of a traced call (with ``trace_id`` and
        ``span_id``) or of a call with fields noted (``caller``, ``deadline``): the plain one's
        fields, made as a dict (rarer records, or ones beside a span: no micro-optimising; with
        keys on every record takes this way, about 10 µs more)."""
        received_us = int(received * 1_000_000)
        responded_us = int(responded * 1_000_000)
        received_second, received_fraction = divmod(received_us, 1_000_000)
        responded_second, responded_fraction = divmod(responded_us, 1_000_000)
        responded_text = utc_seconds(responded_second)
        fields: dict[str, Any] = {
            **self._constants,
            "elapsed_microsecs": responded_us - received_us,
            "http_method": method,
            "http_path": path,
            "http_status": status,
            "request_id": request_id,
            "request_timestamp": f"{utc_seconds(received_second)}.{received_fraction:06d}+00:00",
            "response_timestamp": f"{responded_text}.{responded_fraction:06d}+00:00",
            "timestamp": f"{responded_text}.{responded_fraction // 1000:03d}+00:00",
        }
        if requester_id is not None:
            fields["requester_id"] = requester_id
        if streamed is not None:
            first_byte_us = int(streamed.first_byte * 1_000_000) - received_us
            fields["time_to_first_byte_microsecs"] = first_byte_us
            fields["stream_end"] = streamed.end
            fields["bytes_sent"] = streamed.bytes_sent
            if streamed.chunks is not None:
                fields["chunks"] = streamed.chunks
        if trace_ids is not None:
            fields["trace_id"], fields["span_id"] = trace_ids
        if noted is not None:
            fields.update(noted)
        return str(encode_record(fields))

    def _pend(self, line: str) -> None:
        pending = self._pending
        if not pending:
            loop = asyncio.get_running_loop()
            if self._every:
                loop.call_later(self._every, self.flush)
            else:
                loop.call_soon(self.flush)
        pending.append(line)
        if len(pending) >= _MOST_KEPT:
            self.flush()  # a large write holds the loop: measured, p99 1.4 ms at 50 ms's worth
            # of records, 0.93 ms at 256 (which kept the throughput; 64 lost 3 %)

    def _second(self, second: int) -> str:
        """``2026-11-21T18:14:14``: formatted once per second (both timestamps of a record
        almost always fall in the last one)."""
        if second != self._last_second:
            self._last_second, self._last_text = second, utc_seconds(second)
        return self._last_text

    def flush(self) -> None:
        """Write the records kept so far."""
        lines, self._pending = self._pending, []
        if lines:
            access_logger.info("\n".join(lines), extra={"preformatted": True})


def _record_text(
    method: str,
    path: str,
    status: int,
    received: float,
    responded: float,
    request_id: str,
    requester_id: str | None,
    streamed: StreamedBody | None,
    trace_ids: tuple[str, str] | None,
    noted: Mapping[str, Any] | None,
) -> None:
    """``POST /predict 200 12.3 ms  request_id=...``: the record of a text log, written at once
    (a streamed answer's: ``200 2503.1 ms (first byte 1.2 ms, complete, 5120 bytes)``)."""
    fields = {"request_id": request_id}
    if requester_id is not None:
        fields["requester_id"] = requester_id
    if trace_ids is not None:
        fields["trace_id"], fields["span_id"] = trace_ids
    if noted is not None:
        fields.update({name: str(value) for name, value in noted.items()})
    took = f"{(responded - received) * 1000:.1f} ms"
    if streamed is not None:
        first_byte = (streamed.first_byte - received) * 1000
        chunks = "" if streamed.chunks is None else f", {streamed.chunks} chunks"
        took += (
            f" (first byte {first_byte:.1f} ms, {streamed.end}, {streamed.bytes_sent} bytes"
            f"{chunks})"
        )
    access_logger.info("%s %s %d %s", method, path, status, took, extra={"fields": fields})


_json_string: Final[Any] = json.encoder.encode_basestring
#: The methods as JSON strings, made once (the rest, refused with 405, are encoded each time).
_QUOTED_METHODS: Final = {method: _json_string(method) for method in ALLOWED_METHODS}
#: Records kept at most before they are written, whatever the interval.
_MOST_KEPT: Final = 256
#: The variable fields of an access record and their ``%`` conversions, in the order of the
#: JSON keys, which is the order of the values ``AccessLog.record`` passes (``%``-formatting
#: is twice as fast as ``str.format`` here). ``requester_id`` only when there is one.
_ACCESS_FIELDS: Final = (
    ("elapsed_microsecs", "%d"),
    ("http_method", "%s"),
    ("http_path", "%s"),
    ("http_status", "%d"),
    ("request_id", "%s"),
    ("request_timestamp", '"%s.%06d+00:00"'),
    ("requester_id", "%s"),
    ("response_timestamp", '"%s.%06d+00:00"'),
    ("timestamp", '"%s.%03d+00:00"'),
)
_ACCESS_CONSTANTS: Final = {"log_level": "info", "log_type": "access_log"}


def _access_template(static: dict[str, str], *, with_requester: bool) -> str:
    """A ``%`` template of an access record: the JSON object the encoder would write for it
    (keys sorted; the static fields win over the constants, as in a dict that lists them
    last; the variable fields over both)."""
    values = {key: _escape(encode_record(value)) for key, value in _ACCESS_CONSTANTS.items()}
    values.update({key: _escape(encode_record(value)) for key, value in static.items()})
    fields = [(key, conversion) for key, conversion in _ACCESS_FIELDS]
    if not with_requester:
        fields.remove(("requester_id", "%s"))
    values.update(fields)
    assert [key for key, _ in fields] == sorted(key for key, _ in fields)  # the values' order
    body = ", ".join(f"{_escape(encode_record(key))}: {values[key]}" for key in sorted(values))
    return "{" + body + "}"


def _escape(text: str) -> str:
    return text.replace("%", "%%")
