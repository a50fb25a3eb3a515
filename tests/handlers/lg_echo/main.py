"""Prints the body's ``say`` to stdout and ``warn`` to stderr, then answers with the request id."""

import json
import sys


def handler(request, context):
    body = json.load(request)
    print(body["say"])
    print(body["warn"], file=sys.stderr)
    return {"content_type": "application/json", "content": {"request_id": request.request_id}}
