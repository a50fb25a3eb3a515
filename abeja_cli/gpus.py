"""``--gpus``: the GPUs of a model that run-local or run-local-server starts, written as
``docker run --gpus`` takes them: ``all``, a count (the first N), or ``device=ID[,ID...]``.

The Docker engine asks the engine for them as ``docker run --gpus`` does (a device request,
which needs NVIDIA's Container Toolkit on the machine); the local engine's model sees the
machine's GPUs already, so it is shown the ones a container would get, through
``CUDA_VISIBLE_DEVICES`` (:attr:`GpuRequest.visible_devices`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

import click

__all__ = ["GpuRequest", "GpuRequestType"]

#: A GPU's id as Docker and CUDA take it: an index, or a UUID (``GPU-...``, ``MIG-...``).
_DEVICE_ID: Final = re.compile(r"^[A-Za-z0-9_-]+$")


@dataclass(frozen=True)
class GpuRequest:
    """``count`` GPUs (-1: all of them), or those of ``device_ids``; ``text`` as given."""

    text: str
    count: int = 0
    device_ids: tuple[str, ...] = ()

    @property
    def visible_devices(self) -> str | None:
        """The ``CUDA_VISIBLE_DEVICES`` that shows a process of this machine the GPUs a
        container would get: the listed ones, or the first ``count`` (Docker gives a count as
        ``0,...,N-1``); None for all."""
        if self.device_ids:
            return ",".join(self.device_ids)
        if self.count > 0:
            return ",".join(str(index) for index in range(self.count))
        return None


class GpuRequestType(click.ParamType):  # type: ignore[type-arg,unused-ignore]
    """``all``, a count from 1 (also as ``count=N``, ``count=all``), or ``device=ID[,ID...]``
    (with Docker's quotes around it, which its own ``--gpus`` needs, or without)."""

    name = "gpus"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> GpuRequest:
        if isinstance(value, GpuRequest):
            return value
        text = str(value).strip().strip('"')
        count = text.removeprefix("count=")
        if count == "all":
            return GpuRequest(text, count=-1)
        if count.isdigit() and int(count) > 0:
            return GpuRequest(text, count=int(count))
        ids = tuple(text.removeprefix("device=").split(",")) if text.startswith("device=") else ()
        if ids and all(_DEVICE_ID.match(device) for device in ids):
            return GpuRequest(text, device_ids=ids)
        self.fail(
            f"{value!r} is not a GPU request; write all, a count (2: the first two), or "
            "device=0,1, as docker run --gpus takes them",
            param,
            ctx,
        )
