"""The ``abeja`` command line: run an ABEJA Platform model handler locally.

It drives the ``abeja-runtime`` server, in a Docker container or as a local subprocess, and is
never imported by the runtime itself.
"""

__all__: list[str] = []
