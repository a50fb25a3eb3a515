"""For async (ARMS) requests: answers like a sync handler would, or fails on ``?fail=1``.

The answer carries the async headers it received (they reach the handler like any other) and
a metadata header; ``?stream=1`` answers with a generator, ``?hang=S`` sleeps first.
"""

import json
import time


def handler(request, context):
    query = request.query
    if query.get("fail"):
        raise RuntimeError("the model failed")
    time.sleep(float(query.get("hang", "0")))
    seen = {
        "async_id": request["http_headers"]["x-abeja-arms-async-request-id"],
        "token": request["http_headers"]["x-abeja-arms-async-request-token"],
        "body": json.load(request) if request["content_type"] == "application/json" else None,
    }
    if query.get("stream"):
        return {"content_type": "text/plain", "content": (f"line {i}" for i in range(3))}
    return {"content_type": "application/json", "content": seen, "metadata": {"x-model": "m1"}}
