"""1 MiB binary benchmark handler: measures body streaming cost through the runtime."""

from __future__ import annotations

from typing import Any

CHUNK = 65536


def handler(request: Any, context: Any) -> dict[str, Any]:
    """Read the body in 64 KiB chunks (never all at once) and report its size."""
    n = 0
    while True:
        chunk = request.read(CHUNK)
        if not chunk:
            break
        n += len(chunk)
    return {"content_type": "application/json", "content": {"size": n}}
