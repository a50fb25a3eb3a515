"""Runtimes with a ``--grpc-port``, and the protobuf wire format's varint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from abeja_runtime.launch import free_port


def with_grpc(start: Any, handler_dir: str | Path, *flags: str, env: dict[str, str]) -> Any:
    """A runtime started by ``start`` (a server factory) with a free ``--grpc-port``, which
    it keeps as ``grpc_port``."""
    port = free_port()
    server = start(handler_dir, "--grpc-port", str(port), *flags, env=env)
    server.grpc_port = port
    return server


#: The environment that serves the kserve handlers' asynchronous model.
ASYNC_MODEL = {"HANDLER": "model:AsyncModel"}


def varint(value: int) -> bytes:
    out = b""
    while True:
        low, value = value & 0x7F, value >> 7
        if not value:
            return out + bytes([low])
        out += bytes([low | 0x80])
