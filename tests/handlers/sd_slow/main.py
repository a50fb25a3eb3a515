"""A slow inference: creates the file ``started`` names, then works for ``seconds`` (default 2)."""

import json
import pathlib
import time


def handler(request, context):
    body = json.load(request)
    if body.get("started"):
        pathlib.Path(body["started"]).touch()
    seconds = body.get("seconds", 2)
    time.sleep(seconds)  # the workload under test
    return {"content_type": "application/json", "content": {"slept": seconds}}
