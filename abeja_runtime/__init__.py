"""abeja-runtime: an in-process server for ABEJA Platform model handlers."""

import time

#: When this process first imported the runtime (``time.monotonic``): where the front measures
#: its start from (``front/startup.py``). Not the process's start, which in a container is its
#: creation, before the container runtime lets it run.
IMPORTED_AT = time.monotonic()

from abeja_runtime.batched import batched  # noqa: E402
from abeja_runtime.errors import CallCancelled  # noqa: E402

__all__ = ["CallCancelled", "__version__", "batched"]

#: The one place of the version: pyproject.toml reads it from here. Not looked up through
#: importlib.metadata, which costs every process (supervisor and each worker) ~15 ms at start.
__version__ = "0.1.0"
