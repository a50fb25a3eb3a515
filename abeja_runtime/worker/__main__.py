"""``python -m abeja_runtime.worker FD FRONT_PID``: a handler process (:mod:`.process`), or the
template that handler processes are forked from (:mod:`.template`), as the front's first frame
says."""

import os

from abeja_runtime.worker.process import main, start
from abeja_runtime.worker.template import serve_template

worker, first, front = start()
if first.template:
    os._exit(serve_template(worker.channel, first.config, front))
main(worker, first.config)
