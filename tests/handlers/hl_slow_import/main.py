"""Takes 3 s to import, like a module that loads a large model at import time."""

import time

time.sleep(3)  # the workload under test: a slow import


def handler(request, context):
    return {"content_type": "application/json", "content": {"imported": True}}
