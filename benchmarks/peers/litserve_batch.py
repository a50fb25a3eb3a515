"""LitServe with batching serving the batching benchmark's model (``model.py``).

    python benchmarks/peers/litserve_batch.py PORT

Run with a Python that has litserve and numpy (``/work/venvs/litserve/bin/python``), not the
runtime's. ``max_batch_size=32, batch_timeout=0.005``, one inference worker, defaults
otherwise; ``POST /predict`` with ``{"scale": x}`` answers ``{"sum": ...}``; ``GET /health``
says 200 once the worker is ready. SIGTERM stops it as Ctrl-C does.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "handlers" / "batching"))

import litserve as ls
from model import infer, scale_of

MAX_BATCH_SIZE = 32
BATCH_TIMEOUT = 0.005


class Model(ls.LitAPI):  # type: ignore[misc]
    """The model: ``decode_request`` per request, ``predict`` per batch (a list of scales)."""

    def setup(self, device: Any) -> None:
        pass

    # Unannotated, as in LitServe's examples: LitServe builds its FastAPI route from these
    # annotations (``Any`` would make ``request`` a query parameter).
    def decode_request(self, request):
        return scale_of(request)

    def predict(self, scales: list[float]) -> list[float]:
        return infer(scales)

    def encode_response(self, output):
        return {"sum": output}


def main() -> int:
    port = int(sys.argv[1])
    # LitServe stops its workers on KeyboardInterrupt; SIGTERM alone would orphan them.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    api = Model(max_batch_size=MAX_BATCH_SIZE, batch_timeout=BATCH_TIMEOUT)
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=1)
    server.run(host="127.0.0.1", port=port, generate_client_file=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
