"""Misbehaves towards the runtime's own channel, as handler bugs do: ``?write=1`` writes bytes
to the worker's socket with the front (its descriptor is the worker's first argument);
``?exhaust=1`` opens files until the process has none left, and keeps them. Otherwise it
answers with the worker's pid and the size of the body."""

import os
import resource
import sys

KEPT = []


def handler(request, context):
    if request.query.get("write"):
        os.write(int(sys.argv[1]), b"some bytes the handler meant for a file\n")
    if request.query.get("exhaust"):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 256), hard))
        try:
            while True:
                KEPT.append(open(os.devnull, "rb"))  # noqa: SIM115 - kept open on purpose
        except OSError:
            pass
    size = len(request.read())
    return {"content_type": "application/json", "content": {"pid": os.getpid(), "size": size}}
