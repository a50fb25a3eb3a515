"""The handler of ``python -m benchmarks.fairness``: 5 ms of work (a sleep, as a model on a
device would hold its worker), and how late it started after the caller's deadline
(``x-deadline-at``, seconds since the epoch, as the client reckoned it when it sent); with
``FAIR_LOG`` set, each call's ``x-tag`` and its start (``time.time()``) are appended to that
file as it starts."""

import os
import time

LOG = os.environ.get("FAIR_LOG")


def handler(request, context):
    started = time.time()
    headers = request["http_headers"]
    deadline = headers.get("x-deadline-at")
    if LOG:
        with open(LOG, "a") as log:
            log.write(f"{headers.get('x-tag', '')} {started!r}\n")
    time.sleep(0.005)
    late_by = started - float(deadline) if deadline is not None else 0.0
    return {"content_type": "application/json", "content": {"late_by": max(0.0, late_by)}}
