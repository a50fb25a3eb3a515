"""Fault injection, async: echoes the JSON body after ``?ms=``; ``?block=S`` blocks the worker's
event loop for S seconds (an ``async def`` handler that calls blocking code)."""

import asyncio
import json
import os
import time


async def handler(request, context):
    time.sleep(float(request.query.get("block", "0")))  # the mistake under test: no await
    await asyncio.sleep(float(request.query.get("ms", "0")) / 1000)
    body = json.load(request) if request["content_type"] == "application/json" else None
    return {"content_type": "application/json", "content": {"pid": os.getpid(), "echo": body}}
