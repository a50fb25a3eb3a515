"""``--devices``: each worker gets one GPU as its ``CUDA_VISIBLE_DEVICES``, round-robin over the
slots, before it imports the handler (``--preload off``) or as soon as it is forked from the
template; a worker's replacement gets the same one (issue 31).

No GPU is needed: the ``dv_devices`` handler answers the variable, and its pid.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers.servers import RunningServer, ServerFactory
from helpers.workers import handler_processes, wait_for_ready_workers

from abeja_runtime.front.lifecycle import devices_held
from abeja_runtime.front.pending import ProcessState
from abeja_runtime.front.processes import device_environment


def meet(server: RunningServer, round_name: str, workers: int) -> dict[int, str]:
    """Every worker's device, by pid: ``workers`` calls at once, each waiting in its worker
    until all have arrived, so each is answered by another worker."""
    path = f"/?meet={round_name}&n={workers}"
    with ThreadPoolExecutor(workers) as pool:
        answers = list(pool.map(lambda _: server.request("GET", path), range(workers)))
    assert [answer.status for answer in answers] == [200] * workers, answers[0].body
    devices = {answer.json()["pid"]: answer.json()["device"] for answer in answers}
    assert len(devices) == workers, devices
    return devices


def start_log(server: RunningServer) -> dict[int, str]:
    """The device each worker started with, as the runtime logged it."""
    prefix = "worker "
    found = {}
    for record in server.records():
        message = record.get("message", "")
        if message.startswith(prefix) and " starts with CUDA_VISIBLE_DEVICES=" in message:
            pid, _, rest = message.removeprefix(prefix).partition(" starts with ")
            found[int(pid)] = rest.removeprefix("CUDA_VISIBLE_DEVICES=").split(" ")[0]
    return found


@pytest.mark.parametrize("preload", ["on", "off"])
def test_three_workers_on_two_devices_and_a_replacement_keeps_its_device(
    start: ServerFactory, tmp_path: Path, preload: str
) -> None:
    server = start(
        "dv_devices", "--workers", "3", "--devices", "0,1", "--preload", preload,
        env={"MEET_DIR": str(tmp_path)},
    )  # fmt: skip
    pids = wait_for_ready_workers(server, 3)
    # No interpreter is started early (before the front's loop) for a worker that needs a
    # device, nor left behind: the front's handler processes are the workers.
    assert handler_processes(server.process.pid) == set(pids)
    devices = meet(server, "first", 3)
    assert sorted(devices) == sorted(pids)
    assert start_log(server) == devices
    assert Counter(devices.values()) == {"0": 2, "1": 1}  # 0, 1, 0 by slot

    started = len(pids)
    for device in ("0", "1"):  # a worker of each device dies; its replacement takes its device
        victim = next(pid for pid, held in devices.items() if held == device)
        os.kill(victim, signal.SIGKILL)
        started += 1
        replacement = wait_for_ready_workers(server, started)[-1]
        devices = meet(server, f"after-{victim}", 3)
        assert victim not in devices
        assert devices[replacement] == device, devices
        assert Counter(devices.values()) == {"0": 2, "1": 1}


def test_a_retired_worker_hands_its_device_to_its_replacement(
    start: ServerFactory, tmp_path: Path
) -> None:
    """With --max-requests 1 every worker retires after one answer: its replacement starts
    while it still serves, and takes its device, not the one the others hold fewest of."""
    server = start(
        "dv_devices", "--workers", "3", "--devices", "0,1", "--max-requests", "1",
        env={"MEET_DIR": str(tmp_path)},
    )  # fmt: skip
    first = meet(server, "first", 3)
    wait_for_ready_workers(server, 6)  # the three replacements are ready: the first ones stop
    logged = start_log(server)
    replacements = {pid: device for pid, device in logged.items() if pid not in first}
    assert Counter(replacements.values()) == {"0": 2, "1": 1}, logged
    assert meet(server, "second", 3) == replacements


@pytest.mark.parametrize(
    ("devices", "held", "expected"),
    [
        ("", [], None),  # no --devices: the worker sees what the front sees
        ("0,1", [], "0"),
        ("0,1", ["0"], "1"),
        ("0,1", ["0", "1"], "0"),
        ("0,1", ["0", "1", "0"], "1"),
        ("0,1", ["1", "0"], "0"),  # the replacement of a worker of 0
        ("0,1,2", ["0", "2"], "1"),  # the replacement of a worker of 1
        ("GPU-a,GPU-b", ["GPU-a"], "GPU-b"),
    ],
)
def test_the_next_worker_takes_the_device_fewest_others_hold(
    devices: str, held: list[str], expected: str | None
) -> None:
    environment = device_environment({"A": "1"}, devices, list(held))
    assert environment == ({"CUDA_VISIBLE_DEVICES": expected} if expected else {}) | {"A": "1"}


def test_ids_are_positions_among_the_devices_the_runtime_was_given() -> None:
    """Given GPUs 2 and 3 itself (run-local --gpus device=2,3), the runtime sees them as 0
    and 1, as CUDA numbers them: its worker of 0 gets GPU 2, not the machine's GPU 0."""
    given = {"CUDA_VISIBLE_DEVICES": "2,3"}
    assert device_environment(given, "0,1", [])["CUDA_VISIBLE_DEVICES"] == "2"
    assert device_environment(given, "0,1", ["2"])["CUDA_VISIBLE_DEVICES"] == "3"
    assert device_environment(given, "0,1", ["2", "3"])["CUDA_VISIBLE_DEVICES"] == "2"
    assert device_environment(given, "GPU-a", [])["CUDA_VISIBLE_DEVICES"] == "GPU-a"
    assert device_environment(given, "5", [])["CUDA_VISIBLE_DEVICES"] == "5"  # not among them


def test_workers_that_go_do_not_hold_their_device() -> None:
    """A retiring or stopping worker's device goes to its replacement."""
    staying = [_process("0"), _process("1")]
    retiring = _process("0", retiring="max_requests")
    stopping = _process("1", state=ProcessState.STOPPING)
    assert devices_held([*staying, retiring]) == ["0", "1"]
    assert devices_held([retiring, stopping]) == []
    assert devices_held([staying[0], stopping]) == ["0"]


def _process(
    device: str, *, retiring: str = "", state: ProcessState = ProcessState.READY
) -> SimpleNamespace:
    """What :func:`devices_held` reads of the pool's record of a handler process."""
    return SimpleNamespace(process=SimpleNamespace(device=device), retiring=retiring, state=state)
