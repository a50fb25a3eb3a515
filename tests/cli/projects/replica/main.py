"""A replica under test: answers which container served it, after ``?ms=`` milliseconds."""

import json
import socket
import time


def handler(request, context):
    time.sleep(float(request.query.get("ms", "0")) / 1000)
    body = json.load(request) if request["content_type"] == "application/json" else {}
    return {
        "content_type": "application/json",
        "content": {"host": socket.gethostname(), "echo": body},
    }
