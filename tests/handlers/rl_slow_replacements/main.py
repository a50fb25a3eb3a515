"""The first worker imports at once; every later import (another worker, a replacement) takes
``RL_SLOW`` seconds, like a model load. ``RL_MARKER`` names the file that tells them apart."""

import os
import time

try:
    os.close(os.open(os.environ["RL_MARKER"], os.O_CREAT | os.O_EXCL | os.O_WRONLY))
except FileExistsError:
    time.sleep(float(os.environ.get("RL_SLOW", "4")))


def handler(request, context):
    if request.query.get("exit"):
        os._exit(3)
    time.sleep(float(request.query.get("hang", "0")))
    return {"content_type": "application/json", "content": {"pid": os.getpid()}}
