"""The ``abeja`` command line: run an ABEJA Platform model handler locally.

The package is installed as ``abeja_cli`` (its source lives in ``cli/``). It drives the
``abeja-runtime`` server, in a Docker container or as a local subprocess, and never gets
imported by the runtime itself.
"""

__all__: list[str] = []
