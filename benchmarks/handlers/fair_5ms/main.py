"""The handler of ``python -m benchmarks.fairness``: 5 ms of work (a sleep, as a model on a
device would hold its worker), and how late it started after the caller's deadline
(``x-deadline-at``, seconds since the epoch, as the client reckoned it when it sent); with
``FAIR_LOG`` set, a line for each call is appended to that file as it ends: its ``x-tag``
(``-`` without one), its start and its end (``time.time()``)."""

import os
import time

LOG = os.environ.get("FAIR_LOG")


def handler(request, context):
    started = time.time()
    headers = request["http_headers"]
    deadline = headers.get("x-deadline-at")
    time.sleep(0.005)
    if LOG:
        with open(LOG, "a") as log:
            log.write(f"{headers.get('x-tag', '-')} {started!r} {time.time()!r}\n")
    late_by = started - float(deadline) if deadline is not None else 0.0
    return {"content_type": "application/json", "content": {"late_by": max(0.0, late_by)}}
