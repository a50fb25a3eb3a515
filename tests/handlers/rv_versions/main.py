"""Answers the version that its import read from the file ``RV_VERSION`` names, and its pid. A
version ``broken`` fails its import; a version ``cold`` fails its warm-up (a request whose body
is ``{"warm": true}``); a version ``gated`` is imported once the file ``RV_GATE`` names exists
(within 60 s), so that the test decides when its load is over."""

import json
import os
import time

with open(os.environ["RV_VERSION"]) as version:
    VERSION = version.read().strip()
if VERSION == "broken":
    raise RuntimeError("this version cannot be loaded")
_deadline = time.monotonic() + 60
while VERSION == "gated" and not os.path.exists(os.environ["RV_GATE"]):
    if time.monotonic() > _deadline:
        break
    time.sleep(0.01)  # the workload under test: a slow load


def handler(request, context):
    body = request.read()
    if VERSION == "cold" and body and json.loads(body).get("warm"):
        return {"status_code": 500, "content_type": "application/json", "content": {}}
    return {"content_type": "application/json", "content": {"version": VERSION, "pid": os.getpid()}}
