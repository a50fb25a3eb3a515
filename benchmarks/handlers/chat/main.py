"""The toy chat model of ``python -m benchmarks.openai_streams``, in the runtime's OpenAI style
(``HANDLER=main python -m abeja_runtime --style openai``).

``chat(request)`` streams ``PIECES`` short text pieces, with no sleep (the cost of a stream is
all the server's), or ``pace`` seconds apart when the request's ``metadata`` asks. Its first
piece carries the generator's own timestamps, ``time.time()`` when its body starts (``t0``) and
just before its first yield (``t1``): ``"t0=... t1=... "``, so that the client can take the
generator's own time to its first piece out of the time to first token it measures. LitServe's
peer (``peers/litserve_openai.py``) yields the same pieces from :func:`pieces`, so both servers
run the same generator.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

#: Pieces per answer, the timestamp piece included.
PIECES = 16


def pieces() -> Iterator[str]:
    """The answer: the timestamp piece, then ``PIECES - 1`` short words."""
    t0 = time.time()
    yield f"t0={t0!r} t1={time.time()!r} "
    for index in range(1, PIECES):
        yield f"word{index} "


def pace(metadata: Any) -> float:
    """Seconds between pieces that a request's ``metadata`` asks for (``{"pace": "0.02"}``, as
    a model that takes time per token would), else 0."""
    return float((metadata or {}).get("pace", 0))


async def chat(request: Any) -> AsyncIterator[str]:
    """The runtime's entry point: the pieces of :func:`pieces`, paced as ``metadata`` asks."""
    seconds = pace(request.body.get("metadata"))
    for index, piece in enumerate(pieces()):
        if index and seconds:
            await asyncio.sleep(seconds)
        yield piece
