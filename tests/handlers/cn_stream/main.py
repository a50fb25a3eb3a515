"""Streams for as long as anyone reads, and says when its generator is closed.

``handler`` returns a sync generator, ``async_handler`` an async one, ``def_async_gen`` is a
``def`` handler that returns an async generator; each yields ``<tag> <i>\\n`` every 20 ms, up to
``?lines=`` lines (3,000 by default: a minute), and prints
``{"event": "closed", "tag": ..., "sent": n}`` from its ``finally``. ``watching`` is a ``def``
handler that loops until ``request.cancelled`` is set (a minute at most) and prints
``{"event": "noticed", ...}``. ``closes_badly`` and ``async_closes_badly`` stream as ``handler``
and ``async_handler`` do, from a generator whose ``finally`` raises.
"""

import asyncio
import json
import os
import time

LINES = 3000
PAUSE = 0.02


def _closed(tag: str, sent: int, event: str = "closed") -> None:
    print(json.dumps({"event": event, "tag": tag, "sent": sent}))


def _lines(tag: str, lines: int = LINES):
    sent = 0
    try:
        for index in range(lines):
            yield f"{tag} {index}\n"
            sent += 1
            time.sleep(PAUSE)
    finally:
        _closed(tag, sent)


async def _async_lines(tag: str, lines: int = LINES):
    sent = 0
    try:
        for index in range(lines):
            yield f"{tag} {index}\n"
            sent += 1
            await asyncio.sleep(PAUSE)
    finally:
        _closed(tag, sent)


def _asked(request) -> tuple[str, int]:
    return request.query.get("tag", ""), int(request.query.get("lines", LINES))


def handler(request, context):
    return {"content_type": "text/plain", "content": _lines(*_asked(request))}


async def async_handler(request, context):
    return {"content_type": "text/plain", "content": _async_lines(*_asked(request))}


def def_async_gen(request, context):
    return {"content_type": "text/plain", "content": _async_lines(request.query.get("tag", ""))}


def watching(request, context):
    tag = request.query.get("tag", "")
    _closed(tag, 0, "watching")
    start = time.monotonic()
    while not request.cancelled.wait(0.02):
        if time.monotonic() - start > 60:
            return {"content": {"noticed": False}}
    _closed(tag, 0, "noticed")
    return {"content": {"noticed": True}}


def _held(first: str, until: str):
    yield first
    deadline = time.monotonic() + 20
    while not os.path.exists(until) and time.monotonic() < deadline:
        time.sleep(0.01)
    yield "after the release\n"


async def _async_held(first: str, until: str):
    yield first
    deadline = time.monotonic() + 20
    while not os.path.exists(until) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    yield "after the release\n"


def held(request, context):
    """Yields its first chunk, then waits until the file ``?until=`` exists for the second."""
    content = _held("before the release\n", request.query["until"])
    return {"content_type": "text/plain", "content": content}


async def async_held(request, context):
    content = _async_held("before the release\n", request.query["until"])
    return {"content_type": "text/plain", "content": content}


def _held_items(until: str):
    yield {"item": 0}
    deadline = time.monotonic() + 20
    while not os.path.exists(until) and time.monotonic() < deadline:
        time.sleep(0.01)
    yield {"item": 1}


async def _async_held_items(until: str):
    yield {"item": 0}
    deadline = time.monotonic() + 20
    while not os.path.exists(until) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    yield {"item": 1}


def held_items(request, context):
    """JSON Lines: yields ``{"item": 0}``, then ``{"item": 1}`` once the file ``?until=``
    exists."""
    content = _held_items(request.query["until"])
    return {"content_type": "application/x-ndjson", "content": content}


async def async_held_items(request, context):
    content = _async_held_items(request.query["until"])
    return {"content_type": "application/x-ndjson", "content": content}


async def _async_events(until: str):
    yield {"token": "Hello"}
    deadline = time.monotonic() + 20
    while not os.path.exists(until) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    yield {"token": "world"}
    yield "data: [DONE]\n\n"


async def events(request, context):
    """Server-Sent Events from an async generator; the second event waits for ``?until=``."""
    content = _async_events(request.query["until"])
    return {"content_type": "text/event-stream", "content": content}


def big(request, context):
    """``?mib=N``: an answer of N MiB (not streamed), each byte its offset modulo 251."""
    size = int(request.query["mib"]) * 1024 * 1024
    pattern = bytes(range(251))
    body = (pattern * (size // len(pattern) + 1))[:size]
    _closed(request.query.get("tag", ""), 0, "answered")
    return {"content_type": "application/octet-stream", "content": body}


def sleeper(request, context):
    """Sleeps a minute, in one call (``?steps=1``: a model stuck in native code, as far as
    Python can tell) or in 50 ms steps, and says whether its ``finally`` ran."""
    tag = request.query.get("tag", "")
    steps = int(request.query.get("steps", "1200"))
    _closed(tag, 0, "watching")
    try:
        for _ in range(steps):
            time.sleep(60 / steps)
    finally:
        _closed(tag, 0, "finally")
    return {"content": {"slept": True}}


def _blocks(tag: str, count: int, size: int, say_each: bool = False):
    """``count`` chunks of ``size`` bytes, each byte its chunk's number modulo 256; says when it
    has made its tenth (past the front's window of 8 chunks), with ``say_each`` each chunk it
    made (``made``, before it is yielded) and, from its ``finally``, how many were taken."""
    sent = 0
    try:
        for index in range(count):
            block = bytes([index % 256]) * size
            if say_each:
                _closed(tag, index + 1, "made")
            yield block
            sent += 1
            if sent == 10:
                _closed(tag, sent, "ten")
    finally:
        _closed(tag, sent)


async def _async_blocks(tag: str, count: int, size: int, say_each: bool = False):
    blocks = _blocks(tag, count, size, say_each)
    try:
        for block in blocks:
            yield block
            await asyncio.sleep(0)
    finally:
        blocks.close()


def _blocks_asked(request):
    query = request.query
    say_each = query.get("say") == "each"
    return query.get("tag", ""), int(query["chunks"]), int(query["kib"]) * 1024, say_each


def blocks(request, context):
    """``?chunks=N&kib=K``: a stream of N chunks of K KiB each (a sync generator); ``&say=each``
    prints each chunk it made."""
    return {"content_type": "application/octet-stream", "content": _blocks(*_blocks_asked(request))}


async def async_blocks(request, context):
    """:func:`blocks` from an async generator."""
    content = _async_blocks(*_blocks_asked(request))
    return {"content_type": "application/octet-stream", "content": content}


async def stalling(request, context):
    """Streams ``?lines=`` lines; with ``?stall=S``, first blocks its worker's event loop for S
    seconds (no await), as a handler doing blocking work by mistake would."""
    time.sleep(float(request.query.get("stall", "0")))
    return {"content_type": "text/plain", "content": _async_lines(*_asked(request))}


async def _fails_at_once():
    raise RuntimeError("cn_stream was asked to fail before its first chunk")
    yield ""  # (a generator)


async def failing(request, context):
    """Streams ``?lines=`` lines; with ``?fail=1``, a stream whose generator raises before its
    first chunk."""
    if request.query.get("fail"):
        return {"content_type": "text/plain", "content": _fails_at_once()}
    return {"content_type": "text/plain", "content": _async_lines(*_asked(request))}


def _closes_badly(tag: str):
    try:
        yield from _lines(tag)
    finally:
        raise RuntimeError("cn_stream's generator fails as it closes")


async def _async_closes_badly(tag: str):
    try:
        async for line in _async_lines(tag):
            yield line
    finally:
        raise RuntimeError("cn_stream's generator fails as it closes")


def closes_badly(request, context):
    """Streams as ``handler`` does, from a generator whose ``finally`` raises."""
    return {"content_type": "text/plain", "content": _closes_badly(request.query.get("tag", ""))}


async def async_closes_badly(request, context):
    """Streams as ``async_handler`` does, from a generator whose ``finally`` raises."""
    tag = request.query.get("tag", "")
    return {"content_type": "text/plain", "content": _async_closes_badly(tag)}
