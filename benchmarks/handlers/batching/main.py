"""Batching benchmark handlers (``python -m benchmarks.batching``): the model of ``model.py``.

* ``main:handler``: ``handler(request, context)``, one request per call (the fixed cost is paid
  per request);
* ``main:batch_handler``: ``handler(requests, context)`` for ``--max-batch-size N`` > 1, a list
  of requests per call (the fixed cost is paid once per batch), a list of answers in order.
"""

from __future__ import annotations

import json
from typing import Any

from model import infer, scale_of


def _answer(total: float) -> dict[str, Any]:
    return {"status_code": 200, "content_type": "application/json", "content": {"sum": total}}


def handler(request: Any, context: Any) -> dict[str, Any]:
    """Read ``{"scale": x}``; answer ``{"sum": ...}``."""
    (total,) = infer([scale_of(json.load(request))])
    return _answer(total)


def batch_handler(requests: list[Any], context: Any) -> list[dict[str, Any]]:
    """The same for a batch: one call of the model for all of ``requests``."""
    totals = infer([scale_of(json.load(request)) for request in requests])
    return [_answer(total) for total in totals]


if __name__ == "__main__":
    import time

    for size in (1, 8, 32):
        infer([1.0] * size)
        start = time.perf_counter()
        for _ in range(50):
            infer([1.0] * size)
        took = (time.perf_counter() - start) / 50
        print(f"batch {size}: {took * 1e3:.2f} ms/call, {took / size * 1e3:.3f} ms/request")
