"""Fault injection, async: echoes the JSON body after ``?ms=``; ``?block=S`` blocks the worker's
event loop for S seconds (an ``async def`` handler that calls blocking code); ``?until=PATH``
awaits until the file PATH exists (at most 60 s): a slow call that the test, not the clock,
ends."""

import asyncio
import json
import os
import time


async def handler(request, context):
    time.sleep(float(request.query.get("block", "0")))  # the mistake under test: no await
    if request.query.get("until"):
        deadline = time.monotonic() + 60
        while not os.path.exists(request.query["until"]) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
    await asyncio.sleep(float(request.query.get("ms", "0")) / 1000)
    body = json.load(request) if request["content_type"] == "application/json" else None
    return {"content_type": "application/json", "content": {"pid": os.getpid(), "echo": body}}
