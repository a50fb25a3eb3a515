"""The handler side: what runs in a handler process (:mod:`.process`), and nothing of HTTP
serving. A batch job (:mod:`.batch_job`, with :mod:`.datalake`) invokes the handler the same way,
without a front; only those two import aiohttp (the job's HTTP client), never a handler process.
"""
