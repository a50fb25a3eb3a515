"""What the tests share, importable as ``helpers.<module>`` (pytest puts ``tests/`` on the path:
``rootdir``-based ``prepend`` import mode, ``tests/`` has no ``__init__.py``).

Fixtures stay in ``conftest.py``; everything else the test modules share lives here, so that no
test module imports ``conftest`` (there are two) or another test module.

* ``servers``: ``RunningServer``, ``ServerFactory``, ``runtime_env``, ``HANDLERS``, ...
* ``waiting``: ``wait_until``, the one bounded wait of the suite.
* ``workers``: the workers of a runtime (ready, alive, crashed).
* ``raw_http``: raw-socket requests whose clients leave, and what was logged of them.
* ``metrics``: ``/metrics`` parsed as Prometheus reads it.
* ``grpc_calls``: runtimes with a gRPC port.
* ``load``: a bounded keep-alive load client.
* ``cortex``: the cortex_iris sample's model builder.
* ``cli``: running the real ``abeja`` command (the CLI tests).
"""
