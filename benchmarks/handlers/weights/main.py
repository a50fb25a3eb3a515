"""A model loaded at import: ``WEIGHTS_MIB`` MiB of numpy array, written (so resident), after
``WEIGHTS_IMPORT_SECONDS`` of loading; its version is what the file ``WEIGHTS_VERSION`` names
holds (``broken``: the import fails). The answer names the process and the version."""

import os
import time

import numpy as np

VERSION = ""
if os.environ.get("WEIGHTS_VERSION"):
    with open(os.environ["WEIGHTS_VERSION"]) as version:
        VERSION = version.read().strip()
    if VERSION == "broken":
        raise RuntimeError("this version of the model cannot be loaded")
time.sleep(float(os.environ.get("WEIGHTS_IMPORT_SECONDS", "0")))  # a slow load, as a big model's
WEIGHTS = np.ones(int(os.environ.get("WEIGHTS_MIB", "1024")) * 1024 * 1024 // 8)


def handler(request, context):
    return {"content_type": "application/json", "content": {"pid": os.getpid(), "version": VERSION}}
