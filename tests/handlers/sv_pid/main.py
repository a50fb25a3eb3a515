"""Answers with the worker's pid; ``?exit=1`` kills the worker, ``?hang=S`` sleeps S seconds."""

import os
import time


def handler(request, context):
    if request.query.get("exit"):
        os._exit(3)  # what a segfault in native code looks like to the runtime
    time.sleep(float(request.query.get("hang", "0")))
    return {"content_type": "application/json", "content": {"pid": os.getpid()}}
