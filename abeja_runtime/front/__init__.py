"""The front: the one process that speaks HTTP and gRPC, and the handler processes' supervisor
(:mod:`.supervisor` starts it). It never imports the user's handler: the styles and the handler
run in :mod:`abeja_runtime.worker`. The README's architecture section maps its modules.
"""
