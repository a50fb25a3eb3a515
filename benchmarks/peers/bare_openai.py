"""The floor of ``python -m benchmarks.openai_streams``: the toy chat model of
``handlers/chat/main.py`` served by one plain aiohttp process, with nothing between the request
and the generator.

    python benchmarks/peers/bare_openai.py PORT

``POST /v1/chat/completions`` (with ``"stream": true``) streams ``pieces()``, the very generator
the runtime serves, paced as the request's ``metadata`` asks, as OpenAI's chat completion chunks
(a role chunk, one chunk a piece, a ``finish_reason`` chunk, ``data: [DONE]``), each written as
it is made; ``GET /health`` says 200. On uvloop, the runtime's loop in the benchmark. No request
validation, no admission, no second process: what no server can undercut on the same core, so
that the runtime's times read against it in the same run.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from pathlib import Path

import uvloop
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "handlers" / "chat"))

from main import pace, pieces  # the chat model's folder, put on the path above


def _event(head: dict[str, object], delta: dict[str, str], finish: str | None) -> bytes:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    document = {**head, "choices": [choice]}
    return b"data: " + json.dumps(document, separators=(",", ":")).encode() + b"\n\n"


async def chat(request: web.Request) -> web.StreamResponse:
    asked = await request.json()
    seconds = pace(asked.get("metadata"))
    head = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": asked.get("model", "toy"),
    }
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(_event(head, {"role": "assistant", "content": ""}, None))
    for index, piece in enumerate(pieces()):
        if index and seconds:
            await asyncio.sleep(seconds)
        await response.write(_event(head, {"content": piece}, None))
    await response.write(_event(head, {}, "stop"))
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def main() -> None:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/health", health)
    web.run_app(
        app,
        host="127.0.0.1",
        port=int(sys.argv[1]),
        print=None,
        access_log=None,
        loop=uvloop.new_event_loop(),
    )


if __name__ == "__main__":
    main()
