"""A handler whose import loads "weights" (``PL_MIB`` MiB of numpy array, written, so resident)
and appends its pid to the file ``PL_IMPORTS`` names: the test counts the imports.

What makes a fork unsafe, at import: ``PL_THREAD`` starts a Python thread, ``PL_NATIVE_THREAD``
a thread of native code, ``PL_FAKE_CUDA`` loads the library it names (a copy of one, named
``libcuda.so.1``), ``PL_SOCKETS`` opens a pair of sockets. ``PL_GOMP`` loads the OpenMP library it
names, which alone does not.

``?exit=1`` kills the worker as a segfault would, ``?hold=S`` holds it S seconds, ``?orphan=1``
leaves a subprocess's child behind; each answer says which process ran it and its GPU."""

import ctypes
import faulthandler
import os
import socket
import subprocess
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
if os.environ.get("PL_SOCKETS"):  # a client's connection, opened at import
    CONNECTION = socket.socketpair()
if os.environ.get("PL_GOMP"):  # OpenMP loaded, as by scikit-learn or torch; no pool started
    ctypes.CDLL(os.environ["PL_GOMP"])
if os.environ.get("PL_NATIVE_THREAD"):  # a thread no Python code sees: faulthandler's watchdog
    faulthandler.dump_traceback_later(3600)


def handler(request, context):
    if request.query.get("exit"):
        os._exit(3)
    if request.query.get("orphan"):  # a subprocess's child left behind: the front adopts it
        started = subprocess.run(
            ["sh", "-c", "sleep 0.2 & echo $!"], capture_output=True, text=True, check=True
        )
        return {"content_type": "application/json", "content": {"orphan": int(started.stdout)}}
    time.sleep(float(request.query.get("hold", "0")))
    return {
        "content_type": "application/json",
        "content": {
            "pid": os.getpid(),
            "device": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "weights": float(WEIGHTS[:4].sum()),
        },
    }
