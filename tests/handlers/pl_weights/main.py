"""A handler whose import loads "weights" (``PL_MIB`` MiB of numpy array, written, so resident)
and appends its pid to the file ``PL_IMPORTS`` names: the test counts the imports. At import,
``PL_THREAD`` starts a thread, and ``PL_FAKE_CUDA`` loads the library it names (a copy of one,
named ``libcuda.so.1``): what makes a fork unsafe. ``?exit=1`` kills the worker as a segfault
would, ``?hold=S`` holds it S seconds; each answer says which process ran it and the GPU it was
given."""

import ctypes
import os
import threading
import time

import numpy as np

WEIGHTS = np.ones(int(os.environ.get("PL_MIB", "1")) * 1024 * 1024 // 8)
with open(os.environ["PL_IMPORTS"], "a") as imports:
    imports.write(f"{os.getpid()}\n")
if os.environ.get("PL_THREAD"):
    threading.Thread(target=threading.Event().wait, name="model-refresher", daemon=True).start()
if os.environ.get("PL_FAKE_CUDA"):
    ctypes.CDLL(os.environ["PL_FAKE_CUDA"])


def handler(request, context):
    if request.query.get("exit"):
        os._exit(3)
    time.sleep(float(request.query.get("hold", "0")))
    return {
        "content_type": "application/json",
        "content": {
            "pid": os.getpid(),
            "device": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "weights": float(WEIGHTS[:4].sum()),
        },
    }
