"""``--gpus``: the GPUs of a model that run-local or run-local-server starts, written as
``docker run --gpus`` takes them: ``all``, a count (the first N), or ``device=ID[,ID...]``.

The Docker engine asks the engine for them as ``docker run --gpus`` does (a device request,
which needs NVIDIA's Container Toolkit on the machine); the local engine's model runs on the
machine, so it is given the ids a container would get, through ``CUDA_VISIBLE_DEVICES``
(:attr:`GpuRequest.visible_devices`), and what they name is whatever GPUs the machine has
(:func:`machine_gpus`: as ``nvidia-smi`` lists them).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from typing import Any, Final

import click

from abeja_runtime.config import DEVICE_ID

__all__ = ["GpuRequest", "GpuRequestType", "MachineGpus", "machine_gpus"]

#: The longest wait for ``nvidia-smi``'s list (it starts the driver when nothing holds it).
_NVIDIA_SMI_TIMEOUT: Final = 20.0


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
        if ids and all(DEVICE_ID.match(device) for device in ids):
            return GpuRequest(text, device_ids=ids)
        self.fail(
            f"{value!r} is not a GPU request; write all, a count (2: the first two), or "
            "device=0,1, as docker run --gpus takes them",
            param,
            ctx,
        )


@dataclass(frozen=True)
class MachineGpus:
    """The NVIDIA GPUs of this machine, as ``nvidia-smi`` lists them: their UUIDs, in its
    order; ``absent`` says why it lists none, when it does not."""

    uuids: tuple[str, ...] = ()
    absent: str = ""

    def has(self, device: str) -> bool:
        """Whether ``device`` names one of them as CUDA reads ``CUDA_VISIBLE_DEVICES``: an
        index below their count, or a UUID or the start of one."""
        if device.isdigit():
            return int(device) < len(self.uuids)
        return any(uuid.startswith(device) for uuid in self.uuids)

    def described(self) -> str:
        """``GPUs 0,1`` as nvidia-smi lists them, or why there are none."""
        if not self.uuids:
            return f"no NVIDIA GPU ({self.absent})"
        return "GPUs " + ",".join(str(index) for index in range(len(self.uuids)))


def machine_gpus() -> MachineGpus:
    """The NVIDIA GPUs that ``nvidia-smi`` lists; none, with the reason, where it is not on
    ``PATH`` or fails (no driver loaded)."""
    nvidia_smi = shutil.which("nvidia-smi")
    if nvidia_smi is None:
        return MachineGpus(absent="there is no nvidia-smi on PATH")
    command = [nvidia_smi, "--query-gpu=uuid", "--format=csv,noheader"]
    try:
        listed = subprocess.run(
            command, capture_output=True, text=True, timeout=_NVIDIA_SMI_TIMEOUT, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return MachineGpus(absent=f"nvidia-smi failed: {exc}")
    if listed.returncode != 0:
        said = (listed.stderr or listed.stdout).strip().splitlines()
        reason = said[0] if said else f"exit code {listed.returncode}"
        return MachineGpus(absent=f"nvidia-smi failed: {reason}")
    uuids = tuple(line.strip() for line in listed.stdout.splitlines() if line.strip())
    return MachineGpus(uuids=uuids, absent="" if uuids else "nvidia-smi lists none")
