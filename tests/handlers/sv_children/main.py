"""Starts a child the way handlers do (``?how=exec``: subprocess; ``?how=fork``:
multiprocessing's fork), stops it with ``?sig=term`` (SIGTERM) or ``?sig=int`` (SIGINT) and
answers how it ended: its exit code, or ``None`` if it was still running 10 s later."""

import multiprocessing
import os
import signal
import subprocess

SIGNALS = {"term": signal.SIGTERM, "int": signal.SIGINT}


def _wait_for_signal(started) -> None:
    started.set()
    signal.pause()  # until a signal kills it (or, ignored, for ever: the parent gives up)


def handler(request, context):
    signum = SIGNALS[request.query.get("sig", "term")]
    if request.query.get("how") == "fork":
        fork = multiprocessing.get_context("fork")
        started = fork.Event()
        child = fork.Process(target=_wait_for_signal, args=(started,))
        child.start()
        started.wait(10)
        os.kill(child.pid, signum)
        child.join(10)
        code = child.exitcode
        if code is None:
            child.kill()
            child.join(10)
    else:
        child = subprocess.Popen(["sleep", "60"])
        child.send_signal(signum)
        try:
            code = child.wait(10)
        except subprocess.TimeoutExpired:
            code = None
            child.kill()
            child.wait(10)
    return {"content_type": "application/json", "content": {"exit": code}}
