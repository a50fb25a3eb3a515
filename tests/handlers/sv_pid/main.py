"""Answers with the worker's pid; ``?exit=1`` kills the worker, ``?hang=S`` sleeps S seconds,
``?leak=MB`` keeps that many more megabytes for good (a leaking model)."""

import os
import time

KEPT = []


def handler(request, context):
    if request.query.get("leak"):
        KEPT.append(bytearray(int(request.query["leak"]) * 1024 * 1024))  # zeroed: resident
    if request.query.get("exit"):
        os._exit(3)  # what a segfault in native code looks like to the runtime
    time.sleep(float(request.query.get("hang", "0")))
    return {"content_type": "application/json", "content": {"pid": os.getpid()}}
