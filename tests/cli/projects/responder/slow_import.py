"""A handler module that takes half a minute to import, like a model loading large weights."""

import time

time.sleep(30)


def handler(request, context):
    return {"content": "loaded"}
