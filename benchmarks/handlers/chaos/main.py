"""Chaos workload: a 5 ms handler; ``?exit=1`` kills its worker as a segfault would."""

import os
import time


def handler(request, context):
    if request.query.get("exit"):
        os._exit(3)
    time.sleep(0.005)
    return {"content_type": "application/json", "content": {"pid": os.getpid()}}
