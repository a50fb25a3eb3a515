"""An async generator in the v1 style: each input is echoed back with its position."""

import asyncio


async def handler(_iter, ctx):
    for position, item in enumerate(_iter):
        await asyncio.sleep(0)
        yield {"position": position, "item": item if isinstance(item, dict) else repr(item)}
