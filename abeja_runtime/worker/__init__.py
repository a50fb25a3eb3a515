"""The handler side: what runs in a handler process, and nothing of HTTP serving.

A handler process (:mod:`.process`, started as ``python -m abeja_runtime.worker``) loads the
user's handler (:mod:`.loader`, with the style that :mod:`abeja_runtime.styles` chooses), reads
a call frame, builds ABEJA's request from it (:mod:`.decode`, :mod:`.request`), calls the handler
(:mod:`.calls`; ``async def`` handlers on :mod:`.handler_loop`), encodes the result and writes
the answer frame before it reads the next call. A batch run (:mod:`.batch`, with
:mod:`.datalake`) calls the handler the same way, without a front. Nothing here imports aiohttp.
"""
