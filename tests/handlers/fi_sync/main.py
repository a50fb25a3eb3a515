"""Fault injection, sync: echoes the JSON body after ``?ms=``; ``?exit=1`` kills the worker as a
segfault would; ``?hang=S`` keeps the handler thread busy for S seconds (a stuck model);
``?until=PATH`` keeps it busy until the file PATH exists (at most 60 s): a slow call that the
test, not the clock, ends."""

import json
import os
import time


def handler(request, context):
    if request.query.get("exit"):
        os._exit(3)
    if request.query.get("until"):
        deadline = time.monotonic() + 60
        while not os.path.exists(request.query["until"]) and time.monotonic() < deadline:
            time.sleep(0.01)
    time.sleep(float(request.query.get("hang", "0")))
    time.sleep(float(request.query.get("ms", "0")) / 1000)
    body = json.load(request) if request["content_type"] == "application/json" else None
    return {"content_type": "application/json", "content": {"pid": os.getpid(), "echo": body}}
