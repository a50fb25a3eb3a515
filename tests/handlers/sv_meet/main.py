"""For ``--concurrency 4``: four calls meet (a barrier), then ``?exit=1`` kills the worker
while the three others are still running (they wait 30 s more); any other call answers with
the worker's pid at once."""

import os
import threading
import time

_meeting = threading.Barrier(4, timeout=20)


def handler(request, context):
    if request.query.get("meet") or request.query.get("exit"):
        _meeting.wait()
        if request.query.get("exit"):
            os._exit(3)
        time.sleep(30)
    return {"content_type": "application/json", "content": {"pid": os.getpid()}}
