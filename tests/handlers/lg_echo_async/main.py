"""The async twin of ``lg_echo``."""

import asyncio
import json
import sys


async def handler(request, context):
    body = json.load(request)
    await asyncio.sleep(0)
    print(body["say"])
    print(body["warn"], file=sys.stderr)
    return {"content_type": "application/json", "content": {"request_id": request.request_id}}
