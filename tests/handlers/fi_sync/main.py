"""Fault injection, sync: echoes the JSON body after ``?ms=``; ``?exit=1`` kills the worker as a
segfault would; ``?hang=S`` keeps the handler thread busy for S seconds (a stuck model)."""

import json
import os
import time


def handler(request, context):
    if request.query.get("exit"):
        os._exit(3)
    time.sleep(float(request.query.get("hang", "0")))
    time.sleep(float(request.query.get("ms", "0")) / 1000)
    body = json.load(request) if request["content_type"] == "application/json" else None
    return {"content_type": "application/json", "content": {"pid": os.getpid(), "echo": body}}
