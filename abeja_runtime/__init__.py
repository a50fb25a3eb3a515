"""abeja-runtime: an in-process server for ABEJA Platform model handlers."""

from abeja_runtime.batched import batched
from abeja_runtime.errors import CallCancelled

__all__ = ["CallCancelled", "__version__", "batched"]

#: The one place of the version: pyproject.toml reads it from here. Not looked up through
#: importlib.metadata, which costs every process (supervisor and each worker) ~15 ms at start.
__version__ = "0.1.0"
