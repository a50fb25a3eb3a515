"""A handler that takes a minute, to interrupt the CLI while it waits."""

import time


def handler(request, context):
    time.sleep(60)
    return {"content": "late"}
