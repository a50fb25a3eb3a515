"""Peer servers for ``python -m benchmarks.batching``, each run with its own venv's Python."""
