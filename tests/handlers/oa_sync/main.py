"""The OpenAI style's plain functions, and a token counter of its own (characters)."""

import asyncio


def count_tokens(text):
    return len(text)


def chat(request):
    for word in reversed(request.messages[-1]["content"].split()):
        yield word + " "


def complete(request):
    if request.prompt == "aiter":  # a plain function that returns an async iterator
        return _later(["a", "b", "c"])
    return (f"{request.prompt}-{index} " for index in range(20))


async def _later(pieces):
    for piece in pieces:
        await asyncio.sleep(0)
        yield piece


def embed(request):
    return [[1.0, 2.0] for _ in request.input]
