"""An ``async def`` handler."""

import asyncio


async def handler(request, context):
    await asyncio.sleep(0)
    return {"content_type": "application/json", "content": {"kind": "async"}}
