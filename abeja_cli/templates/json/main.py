"""A JSON model: reads a JSON document, answers a JSON document.

Replace the body of ``handler`` with your model; load models and weights at import time, once.
"""

import json


def handler(request, context):
    body = json.load(request)
    text = str(body.get("text", ""))
    if not text:
        return {
            "status_code": 400,
            "content_type": "application/json",
            "content": {"error": 'send {"text": "..."}'},
        }
    words = text.split()
    return {
        "status_code": 200,
        "content_type": "application/json",
        "content": {"words": len(words), "longest": max(words, key=len)},
    }
