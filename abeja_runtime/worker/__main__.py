"""``python -m abeja_runtime.worker FD FRONT_PID``: a handler process (:mod:`.process`), or the
template that handler processes are forked from (:mod:`.template`), as the front's first frame
says."""

import os

from abeja_runtime.worker.process import WorkerChannel, main, prepare, set_up, start_frame
from abeja_runtime.worker.template import serve_template

sock, front = prepare()
worker = WorkerChannel(sock)
start = start_frame(worker.channel)
if start is None:
    os._exit(2)  # not started by a front of this version
set_up(start.config)
if start.template:
    os._exit(serve_template(worker.channel, start.config, front))
main(worker, start.config)
