"""The handler side: what runs in a handler process, and nothing of HTTP serving.

A handler process (:mod:`.process`, started as ``python -m abeja_runtime.worker``) loads the
user's handler (:mod:`.loader`, with the style that :mod:`abeja_runtime.styles` chooses), reads
a call frame, builds ABEJA's request from it (:mod:`.decode`, :mod:`.request`), calls the handler
(:mod:`.calls`; ``async def`` handlers on :mod:`.handler_loop`), encodes the result and writes
the answer frame (a ``def`` handler at ``--concurrency 1`` before it reads the next call; on
threads or an event loop, calls overlap). A batch run (:mod:`.batch`, with :mod:`.datalake`)
calls the handler the same way, without a front; only those two import aiohttp (the batch
run's HTTP client), never a handler process.
"""
