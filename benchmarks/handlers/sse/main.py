"""Server-Sent Events from an async generator, as a chat model streams tokens: ``?events=N``
events ``?every=S`` seconds apart, each carrying the time it was produced (``time.time()``),
so that the client can tell each chunk's latency. The bare app streams the same events."""

import asyncio
import time


async def _events(count: int, every: float):
    for index in range(count):
        yield {"n": index, "t": time.time()}
        await asyncio.sleep(every)


async def handler(request, context):
    count = int(request.query.get("events", "10"))
    every = float(request.query.get("every", "0.1"))
    return {"content_type": "text/event-stream", "content": _events(count, every)}
