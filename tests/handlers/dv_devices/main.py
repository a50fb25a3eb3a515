"""Answers the worker's pid and its CUDA_VISIBLE_DEVICES (a worker started afresh imported this
module with it; one forked from the template, ``--preload``, set it after its fork).

``?meet=ROUND&n=N`` first waits (up to 20 s) until N workers each have a call of that round
here, met through files under ``MEET_DIR``: N such calls at once are answered by N different
workers (a worker runs one call at a time and gives back the calls waiting behind a slow one).
"""

import os
import time
from pathlib import Path


def handler(request, context):
    meet = request.query.get("meet")
    if meet:
        here = Path(os.environ["MEET_DIR"], meet)
        here.mkdir(parents=True, exist_ok=True)
        (here / str(os.getpid())).touch()
        deadline = time.monotonic() + 20
        while len(list(here.iterdir())) < int(request.query["n"]):
            if time.monotonic() > deadline:
                return {"status_code": 409, "content": "the workers did not meet"}
            time.sleep(0.01)
    return {
        "content_type": "application/json",
        "content": {"pid": os.getpid(), "device": os.environ.get("CUDA_VISIBLE_DEVICES")},
    }
