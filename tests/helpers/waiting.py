"""The one bounded wait of the test suite, shared by the runtime and the CLI tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["wait_until"]


def wait_until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)
