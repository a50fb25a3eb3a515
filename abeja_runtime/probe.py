"""``python -m abeja_runtime.probe``: exit 0 when the local runtime is ready, 1 otherwise.

The production image's ``HEALTHCHECK``: slim base images have no curl, but they have Python.
It asks ``/health_check`` on ``HEALTHCHECK_PORT`` (readiness; ``--live`` asks ``/livez``).
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request
from typing import Final

__all__ = ["main"]

_TIMEOUT: Final = 2.0


def main(argv: list[str]) -> int:
    path = "/livez" if "--live" in argv else "/health_check"
    port = os.environ.get("HEALTHCHECK_PORT", "5001")
    url = f"http://127.0.0.1:{port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=_TIMEOUT) as answer:
            return 0 if answer.status == 200 else 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"abeja-runtime probe: {url}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
