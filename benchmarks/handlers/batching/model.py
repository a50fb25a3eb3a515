"""The fixed-cost model of the batching benchmark, shared by every target (numpy only).

Each call of :func:`infer` costs a fixed ``CALL_COST`` seconds (``time.sleep``, standing for a
GPU kernel launch) plus one 256 x 256 float32 matmul per request, all in one ``np.matmul``
over the stacked batch. A request ``{"scale": s}`` is answered ``{"sum": s * (X @ W).sum()}``
(computed as ``((s * X) @ W).sum()``, so that each request of a batch has its own matrix).

The runtime's handlers (``main.py``) and the peers' apps (``benchmarks/peers/``) import this
file, so that every target does exactly the same work.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

N = 256
#: Seconds of fixed cost per call, whatever the batch size.
CALL_COST = 0.002
_rng = np.random.default_rng(0)
X = _rng.random((N, N), dtype=np.float32)
W = _rng.random((N, N), dtype=np.float32)
#: What ``{"scale": 1}`` is answered (float64, for checking answers with a tolerance).
UNIT_SUM = float((X.astype(np.float64) @ W.astype(np.float64)).sum())


def infer(scales: Sequence[float]) -> list[float]:
    """One call: the fixed cost, then one matmul over the stacked batch; a sum per request."""
    time.sleep(CALL_COST)
    stacked = np.asarray(scales, dtype=np.float32)[:, None, None] * X  # (B, N, N)
    # One BLAS call for the batch: (B*N, N) @ (N, N); a 3-D matmul loops over the batch.
    products = np.matmul(stacked.reshape(-1, N), W).reshape(len(scales), N * N)
    return [float(total) for total in products.sum(axis=1)]


def scale_of(body: object) -> float:
    """The ``scale`` of a decoded request body (``{"scale": 1.5}``)."""
    if not isinstance(body, dict):
        raise ValueError("expected a JSON object")
    return float(body["scale"])
