"""Blocks until the test releases it.

The JSON body names two files: ``started`` is created when the call begins, and the call returns
once ``release`` exists (at most 20 s, so that a broken test cannot hang the handler forever).
``async_handler`` does the same without ever awaiting: it blocks its worker's event loop.
"""

import json
import os
import pathlib
import time


def handler(request, context):
    paths = json.load(request)
    pathlib.Path(paths["started"]).touch()
    deadline = time.monotonic() + 20
    while not os.path.exists(paths["release"]) and time.monotonic() < deadline:
        time.sleep(0.01)
    return {
        "content_type": "application/json",
        "content": {"released": os.path.exists(paths["release"])},
    }


async def async_handler(request, context):
    return handler(request, context)  # the mistake under test: blocking code, no await
