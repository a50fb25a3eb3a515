"""Records every call it gets, per process, and answers what its process has seen: a warm-up
test can tell whether a worker's warm-up calls came before its first client call.

Each call of a handler (a warm-up's or a client's) appends ``{"requests": [[method, content
type] of each request], "loop": the id of its event loop, or None}`` to its process's record;
the answer is ``{"pid": ..., "calls": [the records, this call's last]}``. ``handler`` is a
``def``, ``async_handler`` an ``async def``; ``batch`` takes a batch (``--max-batch-size``) and
``declared`` is that declared batched in the module (``@abeja_runtime.batched``).

A JSON body ``{"fail": "raise"}`` makes the call raise, ``{"fail": "status"}`` answers 400, and
``{"fail": {"once": PATH}}`` raises only when PATH does not exist yet (and creates it): the first
process to get it fails, the next passes. ``?exit=1`` kills the process the way a segfault
would. With ``WU_FIRST_RELEASE`` set, a process's first call creates ``WU_FIRST_STARTED`` and
waits until the file ``WU_FIRST_RELEASE`` names exists (at most 60 s, so that a broken test
cannot hold the worker for ever): a model slow on its first call only.
"""

import asyncio
import json
import os
import time

import abeja_runtime

CALLS = []


def _loop_id():
    try:
        return id(asyncio.get_running_loop())
    except RuntimeError:
        return None


def _first_call_is_slow():
    release = os.environ.get("WU_FIRST_RELEASE")
    if CALLS or not release:
        return
    open(os.environ["WU_FIRST_STARTED"], "w").close()
    deadline = time.monotonic() + 60
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.01)  # the workload under test: a slow first call


def _failure(request):
    """What the request's body asks for: None, or the result or exception of a failed call."""
    if request["content_type"] != "application/json":
        return None
    fail = json.loads(request.read() or b"{}").get("fail")
    if fail == "status":
        return {"status_code": 400, "content_type": "application/json", "content": {"no": 1}}
    if fail == "raise":
        return ValueError("the handler failed on purpose")
    if isinstance(fail, dict) and not os.path.exists(fail["once"]):
        open(fail["once"], "w").close()
        return ValueError("the handler failed once on purpose")
    return None


def _call(requests):
    if any(request.query.get("exit") for request in requests):
        os._exit(3)
    _first_call_is_slow()
    seen = [[request["http_method"], request["content_type"]] for request in requests]
    CALLS.append({"requests": seen, "loop": _loop_id()})
    answer = {"content_type": "application/json", "content": {"pid": os.getpid(), "calls": CALLS}}
    results = []
    for request in requests:
        failure = _failure(request)
        if isinstance(failure, Exception):
            raise failure
        results.append(failure or answer)
    return results


def handler(request, context):
    return _call([request])[0]


async def async_handler(request, context):
    await asyncio.sleep(0)
    return _call([request])[0]


def batch(requests, context):
    return _call(requests)


@abeja_runtime.batched(max_size=4, max_wait=0.01)
def declared(requests, context):
    return _call(requests)
