"""The handler side: what runs in a handler process, and nothing of HTTP serving.

A handler process (:mod:`.process`, started as ``python -m abeja_runtime.worker``) loads the
user's handler (:mod:`.loader`, with the style that :mod:`abeja_runtime.styles` chooses) and
runs the front's calls (:mod:`.runner`) on the executor chosen at start (:mod:`.executors`,
:mod:`.event_loop`): each call's request built (:mod:`.decode`, :mod:`.request`), the handler
invoked (:mod:`.invoke`), the answer written. A batch job (:mod:`.batch_job`, with
:mod:`.datalake`) invokes the handler the same way, without a front; only those two import
aiohttp (the job's HTTP client), never a handler process.
"""
