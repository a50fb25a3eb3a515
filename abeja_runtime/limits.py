"""The limits on a request that the front checks before a handler process sees it: the method,
and the body's size, by its declared length and as it is read (a chunked body has none).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from abeja_runtime.errors import MethodNotAllowed, PayloadTooLarge

__all__ = [
    "ALLOWED_METHODS",
    "BodyCounter",
    "BodyLimits",
    "check_declared_length",
    "check_method",
]

#: PATCH and DELETE are delivered like POST (contract A2); GET carries its query as the body.
ALLOWED_METHODS: Final = ("GET", "POST", "PUT", "PATCH", "DELETE")


@dataclass(frozen=True, slots=True)
class BodyLimits:
    """``max_body_size`` 0 means no limit; bodies above ``spool_threshold`` go to disk."""

    max_body_size: int
    spool_threshold: int
    #: Parts of a multipart/form-data body; 0 means no limit.
    max_parts: int = 0


def check_method(method: str) -> None:
    if method not in ALLOWED_METHODS:
        raise MethodNotAllowed(method, ALLOWED_METHODS)


def check_declared_length(content_length: int | None, limits: BodyLimits) -> None:
    """Refuse a body by its ``Content-Length`` before reading a byte of it."""
    limit = limits.max_body_size
    if limit and content_length is not None and content_length > limit:
        raise PayloadTooLarge(limit)


class BodyCounter:
    """Counts body bytes as they arrive and stops at the limit (chunked bodies have no length)."""

    __slots__ = ("limit", "total")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        if self.limit and self.total > self.limit:
            raise PayloadTooLarge(self.limit)
