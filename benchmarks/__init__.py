"""Benchmarks of abeja-runtime against a bare aiohttp app: ``python -m benchmarks``.

``processes`` reads a server's process tree from /proc, ``servers`` starts and stops the
servers under test, ``load`` drives wrk and the upload client, ``scenarios`` measures, and
``report`` holds the targets, their verdicts and the Markdown of RESULTS.md; ``otlp_sink``
takes the traced runtime's spans (the ``runtime-traced`` target). ``chaos``, ``drain``,
``streams``, ``batching`` and ``metrics_cost`` are separate measurements with their own entry
points.
"""
