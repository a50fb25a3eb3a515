"""The front: the one process that speaks HTTP and gRPC, and the handler processes' supervisor.

:mod:`.supervisor` binds the ports, starts the pool and drains at SIGTERM; :mod:`.connection`
is aiohttp's connection handler with the runtime's limits, :mod:`.direct` answers from
callbacks the requests that came whole and those whose body it reads into shared memory itself
(:mod:`.direct_body`, straight from the socket: :mod:`.capture`), and :mod:`.server` every
other; a body is read when a place is free (:mod:`.body`); :mod:`.pool` keeps the one
queue and the handler processes, :mod:`.deadlines` their calls' deadlines; :mod:`.rpc`
forwards gRPC calls; :mod:`.arms` sends the results of ABEJA's async requests, with aiohttp's
client, which the front loads only then (:mod:`.lean_aiohttp`). The front never
imports the user's handler: the styles and the handler run in :mod:`abeja_runtime.worker`.
"""
