"""Sleeps ``?sleep=S`` seconds as its workload and says when it ran (``time.monotonic()``).

``handler`` is sync, ``async_handler`` the same with ``await asyncio.sleep``. ``?raise=1`` raises.
``?until=PATH`` works instead until the file PATH exists (at most 60 s, so that a broken test
cannot hold the worker for ever): a call that the test ends, not the clock.
Each call also prints JSON events (``start``, ``end``, ``cancelled``) that become log records,
so that a test can see when a call whose client got 504 really ended.
"""

import asyncio
import json
import os
import time

#: Seconds an ``?until=`` call waits at most for its file.
UNTIL_AT_MOST = 60.0


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
    until = request.query.get("until")
    if until:
        deadline = time.monotonic() + UNTIL_AT_MOST
        while not os.path.exists(until) and time.monotonic() < deadline:
            time.sleep(0.01)
    else:
        time.sleep(float(request.query.get("sleep", "0")))
    return _answer(tag, start, _event("end", tag))


async def async_handler(request, context):
    tag = request.query.get("tag", "")
    if request.query.get("raise"):
        raise RuntimeError(f"ex_sleep was asked to fail ({tag})")
    start = _event("start", tag)
    until = request.query.get("until")
    try:
        if until:
            deadline = time.monotonic() + UNTIL_AT_MOST
            while not os.path.exists(until) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        else:
            await asyncio.sleep(float(request.query.get("sleep", "0")))
    except asyncio.CancelledError:
        _event("cancelled", tag)
        raise
    return _answer(tag, start, _event("end", tag))
