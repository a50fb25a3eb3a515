"""Streams ``?chunks=N`` lines from a generator, pausing ``?pause=S`` seconds before each
(and ``?first=S`` before the first, the ``begin`` line).

The first line is ``<tag> begin <t>`` (when the handler was called), then ``<tag> <i> <t>`` per
chunk, with ``t`` from ``time.monotonic()``: together they show when the call held its slot.
``handler`` is sync, ``async_handler`` is an ``async def`` returning the same generator.
"""

import time


def _lines(tag: str, begin: float, count: int, pause: float, first: float):
    time.sleep(first)
    yield f"{tag} begin {begin}\n".encode()
    for index in range(count):
        time.sleep(pause)  # the generator's workload
        yield f"{tag} {index} {time.monotonic()}\n".encode()


def _answer(request) -> dict:
    begin = time.monotonic()
    query = request.query
    count, pause = int(query.get("chunks", "3")), float(query.get("pause", "0.1"))
    first = float(query.get("first", "0"))
    lines = _lines(query.get("tag", ""), begin, count, pause, first)
    return {"content_type": "text/plain", "content": lines}


def handler(request, context):
    return _answer(request)


async def async_handler(request, context):
    return _answer(request)
