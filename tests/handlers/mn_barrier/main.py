"""Two calls must meet: succeeds only when two handler calls run at the same time."""

import threading

_barrier = threading.Barrier(2, timeout=5)


def handler(request, context):
    try:
        _barrier.wait()
    except threading.BrokenBarrierError:
        return {"status_code": 409, "content_type": "application/json", "content": {"met": False}}
    return {"content_type": "application/json", "content": {"met": True}}
