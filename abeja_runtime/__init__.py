"""abeja-runtime: an in-process server for ABEJA Platform model handlers."""

__all__ = ["__version__"]

#: The one place of the version: pyproject.toml reads it from here. Not looked up through
#: importlib.metadata, which costs every process (supervisor and each worker) ~15 ms at start.
__version__ = "0.1.0"
