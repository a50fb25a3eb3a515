"""``LogSink``'s copies of the server's log: one request's lines (for the try-it page), and the
first record of a kind since a mark (how a reload ended, for ``--reload``)."""

from __future__ import annotations

import io
import json
import threading
from typing import Any

from abeja_cli.console import Console
from abeja_cli.server_log import LogSink


def line(**record: Any) -> str:
    return json.dumps(record)


def sink() -> LogSink:
    return LogSink(Console(stream=io.StringIO()))


def test_the_lines_of_one_request_end_with_its_access_record() -> None:
    log = sink()
    log(line(message="started", log_level="info"))
    log(line(message="mine", log_level="info", request_id="a1"))
    log(line(message="other", log_level="info", request_id="b2"))
    found: list[tuple[list[str], bool]] = []
    waiter = threading.Thread(target=lambda: found.append(log.request_lines("a1", timeout=30)))
    waiter.start()
    # Fed by the reader thread as the server writes them, the waiter sees them as they come.
    log(line(message="boom", log_level="error", request_id="a1", traceback="Traceback ...\nE: x"))
    log(line(log_type="access_log", http_status=500, request_id="a1"))
    waiter.join(30)
    assert found == [(["mine", "ERROR: boom\nTraceback ...\nE: x"], True)]


def test_without_an_access_record_the_lines_so_far() -> None:
    log = sink()
    log(line(message="mine", log_level="info", request_id='say "hi"'))
    log("a plain line naming say hi")
    assert log.request_lines('say "hi"', timeout=0) == (["mine"], False)
    assert log.request_lines("nobody", timeout=0) == ([], False)


def test_the_first_wanted_record_since_a_mark_as_it_comes() -> None:
    log = sink()
    log(line(message="reloaded: before the mark"))
    mark = log.mark()
    assert log.record_since(mark, lambda r: r["message"].startswith("reloaded"), timeout=0) is None
    found: list[dict[str, Any] | None] = []
    waiter = threading.Thread(
        target=lambda: found.append(
            log.record_since(mark, lambda r: r["message"].startswith("reloaded"), timeout=30)
        )
    )
    waiter.start()
    log("a plain line")
    log(line(message="reloading"))
    log(line(message="reloaded: every worker", log_level="info"))
    waiter.join(30)
    assert found == [{"message": "reloaded: every worker", "log_level": "info"}]
