"""Small-JSON benchmark handler: measures per-request runtime overhead, not handler work."""

from __future__ import annotations

import json
from typing import Any


def handler(request: Any, context: Any) -> dict[str, Any]:
    """Parse a tiny JSON body and echo a computed value, like the ABEJA tax sample."""
    body = json.load(request)
    total_without_tax = body["total_without_tax"]
    return {
        "status_code": 200,
        "content_type": "application/json; charset=utf8",
        "content": {"total": total_without_tax * 1.08},
    }
