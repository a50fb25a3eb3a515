"""``abeja-runtime batch``: the handler run once per input, with no server and no front
(:mod:`.job`), its inputs and answers in files or ABEJA's DataLake (:mod:`.datalake`). It invokes
the handler as a handler process does (``worker/invoke.py``); only it imports aiohttp's client.
"""
