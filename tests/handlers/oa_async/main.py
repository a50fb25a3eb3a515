"""The OpenAI style's async functions, steered by the request's extra fields (``extra_body``):
``pieces`` (the text pieces to yield; else the last message's words, reversed), ``fail``
(``before`` the first piece or ``during`` the stream), ``forever`` (pieces until closed, each
``?pause`` seconds apart), ``closed`` (a file written when the generator is closed),
``usage`` (counts reported with ``request.report_usage``)."""

import asyncio
import os


def _pieces(request):
    body = request.body
    if "pieces" in body:
        return list(body["pieces"])
    text = request.messages[-1]["content"] if hasattr(request, "messages") else request.prompt
    return [word + " " for word in reversed(text.split())]


async def chat(request):
    body = request.body
    if "usage" in body:
        request.report_usage(**body["usage"])
    if body.get("fail") == "before":
        raise RuntimeError("the model is out of memory")
    try:
        if body.get("forever"):
            count = 0
            while True:
                yield f"tick{count} "
                count += 1
                await asyncio.sleep(body.get("pause", 0.01))
        for index, piece in enumerate(_pieces(request)):
            if body.get("fail") == "during" and index == 2:
                raise RuntimeError("the model lost its GPU")
            yield piece
    finally:
        if body.get("closed"):
            with open(body["closed"], "w") as marker:
                marker.write(str(os.getpid()))


async def complete(request):
    if request.body.get("fail") == "before":
        raise ValueError("no prompt today")
    return "".join(_pieces(request))


async def embed(request):
    if request.body.get("fail") == "before":
        raise OSError("the embedder is broken")
    return [
        [float(len(text)), float(index), 0.5, -1.25] for index, text in enumerate(request.input)
    ]
