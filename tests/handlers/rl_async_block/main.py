"""An ``async def`` handler; ``?block=S`` blocks the worker's event loop for S seconds."""

import os
import time


async def handler(request, context):
    time.sleep(float(request.query.get("block", "0")))  # the mistake under test: no await
    return {"content_type": "application/json", "content": {"pid": os.getpid()}}
