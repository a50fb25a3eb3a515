"""``python -m abeja_runtime.worker FD FRONT_PID``: a handler process (:mod:`.process`)."""

from abeja_runtime.worker.process import main

main()
