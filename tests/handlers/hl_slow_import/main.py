"""Imports slowly, like a module that loads a large model at import time: the import ends once
the file that ``HL_IMPORT_UNTIL`` names exists (at most 60 s, so that a broken test cannot hold
the worker for ever), so that the test, not the clock, decides when loading is over."""

import os
import time

_until = os.environ.get("HL_IMPORT_UNTIL")
_deadline = time.monotonic() + 60
while _until and not os.path.exists(_until) and time.monotonic() < _deadline:
    time.sleep(0.01)  # the workload under test: a slow import


def handler(request, context):
    return {"content_type": "application/json", "content": {"imported": True}}
