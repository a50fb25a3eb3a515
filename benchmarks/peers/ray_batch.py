"""Ray Serve with ``@serve.batch`` serving the batching benchmark's model (``model.py``).

    python benchmarks/peers/ray_batch.py PORT [--max-ongoing-requests N]

Run with a Python that has ``ray[serve]`` and numpy (``/work/venvs/ray/bin/python``), not the
runtime's. One replica behind Ray Serve's own HTTP proxy on 127.0.0.1:PORT; ``POST /`` with
``{"scale": x}`` answers ``{"sum": ...}``, ``GET /health_check`` answers ``{"status": "ok"}``
once the application is deployed. Everything else is Ray's default (``max_ongoing_requests``
too, unless given). SIGTERM or SIGINT shuts Serve and Ray down.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

MODEL_DIR = str(Path(__file__).resolve().parent.parent / "handlers" / "batching")
sys.path.insert(0, MODEL_DIR)
# Ray's worker processes (the replica's) import ``model`` too; they inherit this environment.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [MODEL_DIR, os.environ.get("PYTHONPATH")]))
os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")

import ray  # noqa: E402
from model import infer, scale_of  # noqa: E402
from ray import serve  # noqa: E402
from starlette.requests import Request  # noqa: E402

MAX_BATCH_SIZE = 32
BATCH_WAIT_TIMEOUT_S = 0.005


@serve.deployment
class Model:
    """The model; requests are batched by ``@serve.batch``."""

    @serve.batch(max_batch_size=MAX_BATCH_SIZE, batch_wait_timeout_s=BATCH_WAIT_TIMEOUT_S)
    async def predict(self, scales: list[float]) -> list[float]:
        return infer(scales)

    async def __call__(self, request: Request) -> Any:
        if request.method == "GET":
            return {"status": "ok"}
        return {"sum": await self.predict(scale_of(await request.json()))}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("--max-ongoing-requests", type=int, default=0, help="0: Ray's default")
    args = parser.parse_args()
    ray.init(include_dashboard=False, log_to_driver=False)
    # After ray.init, which installs handlers of its own: stop in order, below.
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": args.port})
        options = {}
        if args.max_ongoing_requests:
            options["max_ongoing_requests"] = args.max_ongoing_requests
        serve.run(Model.options(**options).bind(), route_prefix="/", blocking=False)
        print(f"ray serve ready on 127.0.0.1:{args.port}", flush=True)
        stop.wait()
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
