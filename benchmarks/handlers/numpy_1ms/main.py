"""~1 ms numpy benchmark handler: a fixed float64 matmul, JSON in and out.

N was picked by running this file directly (``python main.py``) on the benchmark machine
(2-core Xeon, OpenBLAS, OPENBLAS_NUM_THREADS=1): N=272 took 0.96-0.99 ms per call.
The benchmark pins BLAS to one thread so the matmul does not fight wrk and the server for cores.
The bare app imports ``work`` from this file so both targets do exactly the same work.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

N = 272
_rng = np.random.default_rng(0)
_A = _rng.random((N, N))
_B = _rng.random((N, N))


def work(scale: float) -> float:
    """The ~1 ms of work: one N x N matmul, reduced to a scalar so the response stays small."""
    return float(np.trace(_A @ _B)) * scale


def handler(request: Any, context: Any) -> dict[str, Any]:
    """Read ``{"scale": x}``, do the matmul, return ``{"result": ...}``."""
    body = json.load(request)
    return {
        "status_code": 200,
        "content_type": "application/json",
        "content": {"result": work(float(body["scale"]))},
    }


def _calibrate() -> None:
    """Print per-call time for a few sizes so N can be re-chosen on another machine."""
    import time

    for n in (192, 224, 256, 272, 288, 320):
        a = _rng.random((n, n))
        b = _rng.random((n, n))
        for _ in range(20):
            a @ b
        reps = 300
        t0 = time.perf_counter()
        for _ in range(reps):
            np.trace(a @ b)
        print(f"N={n}: {(time.perf_counter() - t0) / reps * 1e3:.3f} ms/call")


if __name__ == "__main__":
    _calibrate()
