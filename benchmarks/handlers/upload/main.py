"""Upload handler for the 1 GiB streaming-memory test: must never hold the whole body."""

from __future__ import annotations

from typing import Any

CHUNK = 1 << 20


def handler(request: Any, context: Any) -> dict[str, Any]:
    """Read the body 1 MiB at a time so any RSS growth is the runtime's, not ours."""
    n = 0
    while True:
        chunk = request.read(CHUNK)
        if not chunk:
            break
        n += len(chunk)
    return {"content_type": "application/json", "content": {"size": n}}
