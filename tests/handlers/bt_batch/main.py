"""Batched handlers (``--max-batch-size``): each answers every request of its batch with what it
saw, so that a test can tell which requests shared a call and that nothing was mixed.

``handler`` answers ``{"batch": [ids of the batch], "id": its own id, "headers": its own
x-tag header, "query": its own query, "body": its own body}``; a request whose query says
``fail=item`` is answered with an exception instance, ``fail=batch`` makes the handler raise,
``fail=length`` returns one response too few. ``?hold=<path>`` makes the call wait until the
file exists (a busy worker). ``async_handler`` is the same as ``async def``. ``one`` is the
unbatched form of ``handler``, to compare a batch of 1 with; ``declared`` is ``handler``
declared batched in the module (``@abeja_runtime.batched``).
"""

import asyncio
import json
import os
import time

import abeja_runtime


def _held(requests) -> str | None:
    for request in requests:
        hold = request.query.get("hold")
        if hold:
            return hold
    return None


def _announce(requests):
    """Says which requests share this call, as it begins."""
    ids = [request.query.get("id", "") for request in requests]
    print(json.dumps({"event": "batch", "ids": ids}))
    return ids


def _answers(requests, ids):
    answers = []
    for request in requests:
        if request.query.get("fail") == "item":
            answers.append(ValueError(f"item {request.query.get('id')} failed"))
            continue
        answers.append(
            {
                "status_code": 200,
                "content_type": "application/json",
                "content": {
                    "batch": ids,
                    "id": request.query.get("id", ""),
                    "tag": request["http_headers"].get("x-tag", ""),
                    "query": dict(request.query),
                    "body": request.read().decode(),
                },
                "metadata": {"x-id": request.query.get("id", "")},
            }
        )
    if any(request.query.get("fail") == "batch" for request in requests):
        raise RuntimeError("the whole batch failed")
    if any(request.query.get("fail") == "length" for request in requests):
        return answers[:-1]
    return answers


def handler(requests, context):
    ids = _announce(requests)
    hold = _held(requests)
    deadline = time.monotonic() + 30
    while hold and not os.path.exists(hold) and time.monotonic() < deadline:
        time.sleep(0.005)
    return _answers(requests, ids)


async def async_handler(requests, context):
    ids = _announce(requests)
    hold = _held(requests)
    deadline = time.monotonic() + 30
    while hold and not os.path.exists(hold) and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    return _answers(requests, ids)


def one(request, context):
    return _answers([request], _announce([request]))[0]


@abeja_runtime.batched(max_size=8, max_wait=30)
def declared(requests, context):
    """:func:`handler`, declared batched in its module rather than by the settings."""
    return handler(requests, context)
