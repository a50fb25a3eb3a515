"""A callable object whose ``__call__`` is a coroutine function."""

import asyncio


class Model:
    async def __call__(self, request, context):
        await asyncio.sleep(0)
        return {"content_type": "application/json", "content": {"kind": "async-callable"}}


handler = Model()
