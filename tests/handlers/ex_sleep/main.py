"""Sleeps ``?sleep=S`` seconds as its workload and says when it ran (``time.monotonic()``).

``handler`` is sync, ``async_handler`` the same with ``await asyncio.sleep``. ``?raise=1`` raises.
Each call also prints JSON events (``start``, ``end``, ``cancelled``) that become log records,
so that a test can see when a call whose client got 504 really ended.
"""

import asyncio
import json
import os
import time


def _event(event: str, tag: str) -> float:
    now = time.monotonic()
    print(json.dumps({"event": event, "tag": tag, "t": now}))
    return now


def _answer(tag: str, start: float, end: float) -> dict:
    content = {"tag": tag, "start": start, "end": end, "pid": os.getpid()}
    return {"status_code": 200, "content_type": "application/json", "content": content}


def handler(request, context):
    tag = request.query.get("tag", "")
    if request.query.get("raise"):
        raise RuntimeError(f"ex_sleep was asked to fail ({tag})")
    start = _event("start", tag)
    time.sleep(float(request.query.get("sleep", "0")))
    return _answer(tag, start, _event("end", tag))


async def async_handler(request, context):
    tag = request.query.get("tag", "")
    if request.query.get("raise"):
        raise RuntimeError(f"ex_sleep was asked to fail ({tag})")
    start = _event("start", tag)
    try:
        await asyncio.sleep(float(request.query.get("sleep", "0")))
    except asyncio.CancelledError:
        _event("cancelled", tag)
        raise
    return _answer(tag, start, _event("end", tag))
