"""``@abeja_runtime.batched``: a handler module's own say that its handler takes batches.

The same as ``--max-batch-size`` and ``--max-batch-wait`` (``ABEJA_RUNTIME_MAX_BATCH_SIZE``,
``ABEJA_RUNTIME_MAX_BATCH_WAIT``), declared where the handler's signature is, so that the code
that takes a list cannot be served without it: a handler written for batches and deployed
without the variables would get one request where it expects a list. Settings given on the
command line or in the environment (a batch size above 1) win over the declaration.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Final, TypeVar

__all__ = ["BATCH_ATTRIBUTE", "batched", "declared_batch"]

#: Where the declaration is kept on the handler.
BATCH_ATTRIBUTE: Final = "__abeja_batch__"

_Handler = TypeVar("_Handler", bound=Callable[..., Any])


def batched(max_size: int = 32, max_wait: float = 0.01) -> Callable[[_Handler], _Handler]:
    """Declare ``handler(requests, context)`` batched: up to ``max_size`` requests a call, a
    batch gathering for at most ``max_wait`` seconds while every worker is busy::

        @abeja_runtime.batched(max_size=32, max_wait=0.005)
        def handler(requests, context):
            ...
    """
    if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 2:
        raise ValueError(f"batched(max_size=...) must be a whole number above 1, got {max_size!r}")
    if not isinstance(max_wait, int | float) or not math.isfinite(max_wait) or max_wait < 0:
        raise ValueError(f"batched(max_wait=...) must be seconds, 0 or more, got {max_wait!r}")

    def mark(handler: _Handler) -> _Handler:
        setattr(handler, BATCH_ATTRIBUTE, (max_size, float(max_wait)))
        return handler

    return mark


def declared_batch(handler: object) -> tuple[int, float] | None:
    """The handler's declared batch size and wait, if it was declared batched."""
    declared = getattr(handler, BATCH_ATTRIBUTE, None)
    return declared if isinstance(declared, tuple) else None
