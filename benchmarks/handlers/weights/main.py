"""A model loaded at import: ``WEIGHTS_MIB`` MiB of numpy array, written (so resident), after
``WEIGHTS_IMPORT_SECONDS`` of loading; the answer names the process that ran it."""

import os
import time

import numpy as np

time.sleep(float(os.environ.get("WEIGHTS_IMPORT_SECONDS", "0")))  # a slow load, as a big model's
WEIGHTS = np.ones(int(os.environ.get("WEIGHTS_MIB", "1024")) * 1024 * 1024 // 8)


def handler(request, context):
    return {"content_type": "application/json", "content": {"pid": os.getpid()}}
