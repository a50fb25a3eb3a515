"""Handlers for the CLI tests; each is chosen with ``-h main:<name>``."""

import json
import os
import sys


def echo(request, context):
    """The request body back, byte for byte, with the request's Content-Type."""
    return {
        "content_type": request["content_type"] or "application/octet-stream",
        "content": request.read(),
    }


def unicode(request, context):
    return {"content_type": "application/json", "content": {"name": "日本語", "n": [1, 2]}}


def text(request, context):
    return {"content_type": "text/plain", "content": "hello"}


def teapot(request, context):
    return {
        "status_code": 418,
        "content_type": "application/json",
        "content": {"message": "short and stout"},
    }


def describe(request, context):
    """What the handler sees: method, content type, body, and its environment."""
    names = [
        "HANDLER",
        "ABEJA_TRAINING_RESULT_DIR",
        "ABEJA_ORGANIZATION_ID",
        "FROM_E",
        "FROM_COLON",
        "FROM_FILE",
        "OVERRIDDEN",
        "PYTHONUNBUFFERED",
    ]
    return {
        "content_type": "application/json",
        "content": {
            "method": request["http_method"],
            "content_type": request["content_type"],
            "body": request.read().decode("utf-8", "replace"),
            "env": {name: os.environ.get(name) for name in names},
            "cwd": os.getcwd(),
            "python": sys.version_info[:2],
            "uid": os.getuid(),
        },
    }


def variables(request, context):
    """The values of the variables the request's JSON list names (None: unset)."""
    return {
        "content_type": "application/json",
        "content": {name: os.environ.get(name) for name in json.load(request)},
    }


def batched_variables(requests, context):
    """``variables`` as a batched handler: a list of requests in, an answer for each out."""
    return [variables(request, context) for request in requests]


def dumps(request, context):
    """JSON Lines (a list) under application/json: not one JSON document."""
    return {"content_type": "application/json", "content": [{"a": 1}, {"b": 2}]}


def environ(request, context):
    """The names of the variables the model sees."""
    return {"content_type": "application/json", "content": sorted(os.environ)}


def mislabelled(request, context):
    """Bytes under a JSON label: what a handler that forgot its content_type answers."""
    return {"content_type": "application/json", "content": bytes(range(256))}


def held_stream(request, context):
    """Streams ``first``, then ``second`` once the file named by ``RELEASE`` exists (20 s at
    most): the second line is produced only after the first was seen."""
    import time
    from pathlib import Path

    def lines():
        yield b"first\n"
        release = Path(os.environ["RELEASE"])
        deadline = time.monotonic() + 20
        while not release.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        yield b"second\n"

    return {"content_type": "text/plain", "content": lines()}


def chatty(request, context):
    """Lines in turns through ``print`` (a log record, on the runtime's stdout) and straight
    on stderr (as a library or a subprocess writes), then the answer ``done``."""
    for number in range(1, 201):
        print(f"printed {number}")
        os.write(2, f"on stderr {number}\n".encode())
    return {"content_type": "text/plain", "content": "done"}
