"""A slow inference: creates the file ``started`` names, then works for ``seconds`` (default 2).

When the body names a ``release`` file instead, the work ends once that file exists (at most
60 s, so that a broken test cannot hold the worker for ever): the test, not the clock, decides.
"""

import json
import os
import pathlib
import time


def handler(request, context):
    body = json.load(request)
    if body.get("started"):
        pathlib.Path(body["started"]).touch()
    if body.get("release"):
        deadline = time.monotonic() + 60
        while not os.path.exists(body["release"]) and time.monotonic() < deadline:
            time.sleep(0.01)  # the workload under test
        released = os.path.exists(body["release"])
        return {"content_type": "application/json", "content": {"released": released}}
    seconds = body.get("seconds", 2)
    time.sleep(seconds)  # the workload under test
    return {"content_type": "application/json", "content": {"slept": seconds}}
