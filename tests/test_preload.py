"""``--preload`` (on by default): the handler is imported once, in a template process, and every
worker, first ones and replacements alike, is forked from it (issue 39).

The ``pl_weights`` handler holds an array of ``PL_MIB`` MiB ("weights") and appends its pid to the
file ``PL_IMPORTS`` names at each import, so the tests count imports and read, from ``/proc``,
how much memory the processes share.
"""

from __future__ import annotations

import _ctypes
import ctypes.util
import os
import re
import shutil
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers.metrics import scrape
from helpers.metrics import total as total_of
from helpers.servers import RunningServer, ServerFactory
from helpers.waiting import wait_until
from helpers.workers import alive, crash_a_worker, pid_of, wait_for_ready_workers

MIB = 1024 * 1024
FORKED = re.compile(r"worker (\d+) was forked from the template in \d+\.\d{3} s .*")


def imports(path: Path) -> list[int]:
    """The pids of the processes that imported the handler, in order."""
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def children_of(pid: int) -> set[int]:
    return {
        int(child)
        for task in Path(f"/proc/{pid}/task").iterdir()
        for child in (task / "children").read_text().split()
    }


def memory(pid: int) -> dict[str, int]:
    """``/proc/PID/smaps_rollup`` in bytes: Rss, Pss, Shared_Dirty..."""
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, value, *_ = line.split()
        fields[name.rstrip(":")] = int(value) * 1024
    return fields


def template_of(server: RunningServer, workers: list[int]) -> int:
    (template,) = children_of(server.process.pid) - set(workers)
    return template


def forked(server: RunningServer) -> set[int]:
    return {
        int(match.group(1))
        for record in server.records()
        if (match := FORKED.fullmatch(record.get("message", "")))
    }


def serve(start: ServerFactory, tmp_path: Path, *flags: str, **env: str) -> RunningServer:
    return start("pl_weights", *flags, env={"PL_IMPORTS": str(tmp_path / "imports"), **env})


def test_the_workers_share_the_memory_of_one_import(start: ServerFactory, tmp_path: Path) -> None:
    server = serve(start, tmp_path, "--workers", "3", PL_MIB="256")
    workers = wait_for_ready_workers(server, 3)
    template = template_of(server, workers)

    assert imports(tmp_path / "imports") == [template]
    assert forked(server) == set(workers)
    for worker in workers:  # the weights' pages, written by the template, are the template's
        assert memory(worker)["Shared_Dirty"] >= 256 * MIB, memory(worker)
    # Summed as the kernel apportions shared pages, four processes hold about one copy.
    total = sum(memory(pid)["Pss"] for pid in [template, *workers])
    assert 256 * MIB <= total < 1.3 * 256 * MIB + 4 * 16 * MIB, total / MIB


def test_preload_off_imports_in_each_worker(start: ServerFactory, tmp_path: Path) -> None:
    server = serve(start, tmp_path, "--workers", "2", "--preload", "off", PL_MIB="64")
    workers = wait_for_ready_workers(server, 2)

    assert sorted(imports(tmp_path / "imports")) == sorted(workers)
    assert children_of(server.process.pid) == set(workers)  # no template
    assert sum(memory(pid)["Pss"] for pid in workers) >= 2 * 64 * MIB
    assert forked(server) == set()


def test_a_crashed_worker_is_replaced_by_a_fork_with_no_new_import(
    start: ServerFactory, tmp_path: Path
) -> None:
    server = serve(start, tmp_path, "--workers", "2")
    first = wait_for_ready_workers(server, 2)

    assert crash_a_worker(server) == 502
    replacement = wait_for_ready_workers(server, 3)[2]

    assert replacement not in first
    assert replacement in forked(server)
    assert len(imports(tmp_path / "imports")) == 1
    assert replacement in children_of(server.process.pid)  # adopted: reaped like the others
    answers = {pid_of(server.request("GET", "/")) for _ in range(6)}
    assert answers <= {*first, replacement} and answers
    crashed = next(pid for pid in first if not alive(pid))
    assert crashed not in children_of(server.process.pid)  # reaped, no zombie left


def test_a_template_that_dies_is_started_again_and_the_workers_serve_on(
    start: ServerFactory, tmp_path: Path
) -> None:
    server = serve(start, tmp_path, "--workers", "2")
    workers = wait_for_ready_workers(server, 2)
    template = template_of(server, workers)

    os.kill(template, signal.SIGKILL)
    record = server.wait_for_record(
        lambda r: r.get("message", "").startswith("the template process exited")
    )
    assert record["message"] == (
        "the template process exited (killed by SIGKILL); starting it again in 0 s"
    )
    assert {pid_of(server.request("GET", "/")) for _ in range(4)} <= set(workers)
    wait_until(lambda: len(imports(tmp_path / "imports")) == 2, 30, "a second template")
    second = imports(tmp_path / "imports")[1]

    assert crash_a_worker(server) == 502
    replacement = wait_for_ready_workers(server, 3)[2]
    assert replacement in forked(server)
    assert imports(tmp_path / "imports") == [template, second]


@pytest.mark.parametrize(
    ("env", "hazard"),
    [
        (
            {"PL_THREAD": "1"},
            "the handler's import started 1 Python thread(s) (model-refresher), which a forked "
            "process would not have",
        ),
        (
            {"PL_FAKE_CUDA": "cuda"},
            "the handler's import initialised CUDA, which a forked process cannot use",
        ),
        (
            {"PL_NATIVE_THREAD": "1"},
            "the handler's import started 1 thread(s) of a native library, which a forked "
            "process would not have",
        ),
        (
            {"PL_SOCKETS": "1"},
            "the handler's import opened 2 socket(s) (a connection, a client), which the forked "
            "processes would share",
        ),
    ],
    ids=["thread", "cuda", "native-thread", "sockets"],
)
def test_where_a_fork_is_not_safe_each_worker_imports_the_handler(
    start: ServerFactory, tmp_path: Path, env: dict[str, str], hazard: str
) -> None:
    if "PL_FAKE_CUDA" in env:  # any shared library, under the name of CUDA's driver
        fake = tmp_path / "libcuda.so.1"
        shutil.copyfile(_ctypes.__file__, fake)
        env = {"PL_FAKE_CUDA": str(fake)}
    server = serve(start, tmp_path, "--workers", "2", **env)
    workers = wait_for_ready_workers(server, 2)

    record = server.wait_for_record(lambda r: "no --preload" in r.get("message", ""))
    assert record["message"] == (
        f"each worker imports the handler itself (no --preload): {hazard}; start the runtime "
        "with --preload off to say so and load it once less"
    )
    assert record["log_level"] == "warning"
    imported = imports(tmp_path / "imports")
    assert len(imported) == 3 and set(workers) <= set(imported)  # the template's, then each
    assert forked(server) == set()
    assert children_of(server.process.pid) == set(workers)  # the template has exited


def test_each_forked_worker_is_given_its_device(start: ServerFactory, tmp_path: Path) -> None:
    """With ``--devices``, a worker forked from the template sets its own
    ``CUDA_VISIBLE_DEVICES`` before anything runs in it: a GPU model loaded after the fork (in
    the warm-up or the first call) is loaded on that device."""
    server = serve(start, tmp_path, "--workers", "2", "--devices", "0,1")
    workers = wait_for_ready_workers(server, 2)

    seen: dict[int, str] = {}

    def both() -> bool:  # two calls at once: each worker runs one at a time
        with ThreadPoolExecutor(2) as pool:
            for answer in pool.map(lambda _: server.request("GET", "/?hold=0.2"), range(2)):
                seen[answer.json()["pid"]] = answer.json()["device"]
        return len(seen) == 2

    wait_until(both, 30, "an answer from each worker")
    assert sorted(seen) == sorted(workers)
    assert sorted(seen.values()) == ["0", "1"]
    assert forked(server) == set(workers)


def test_numpy_and_openmp_loaded_without_a_pool_are_forked(
    start: ServerFactory, tmp_path: Path
) -> None:
    """numpy's OpenBLAS starts its threads at import (and again in a forked process); OpenMP
    loaded but not used started none: a fork is safe (scikit-learn, torch on CPU)."""
    gomp = ctypes.util.find_library("gomp")
    if gomp is None:
        pytest.skip("OpenMP's libgomp is not installed here (apt-get install libgomp1)")
    server = serve(start, tmp_path, "--workers", "2", PL_GOMP=gomp)
    workers = wait_for_ready_workers(server, 2)
    assert forked(server) == set(workers)
    assert len(imports(tmp_path / "imports")) == 1


def test_forked_workers_hold_no_socket_of_another(start: ServerFactory, tmp_path: Path) -> None:
    """Forks asked for at once arrive in one read of the template: each forked process closes
    the sockets of the others."""
    server = serve(start, tmp_path, "--workers", "3")
    workers = wait_for_ready_workers(server, 3)
    sockets = {pid: _sockets(pid) for pid in [template_of(server, workers), *workers]}
    for pid, held in sockets.items():
        others = set().union(*(theirs for other, theirs in sockets.items() if other != pid))
        assert not held & others, (pid, sockets)


def test_the_orphans_the_front_adopts_are_reaped(start: ServerFactory, tmp_path: Path) -> None:
    """The front adopts its descendants' orphans (a child subreaper, for the forked workers):
    a handler's subprocess's child left behind is reaped once it exits, not left a zombie."""
    server = serve(start, tmp_path)
    wait_for_ready_workers(server, 1)
    orphan = server.request("GET", "/?orphan=1").json()["orphan"]
    wait_until(lambda: not Path(f"/proc/{orphan}").exists(), 30, f"orphan {orphan} to be reaped")


def _sockets(pid: int) -> set[str]:
    found = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:"):
            found.add(target)
    return found


START = re.compile(
    r"ready (\d+\.\d\d) s after the runtime started: (\d+\.\d\d) s the runtime's own start, "
    r"(\d+\.\d\d) s the handler's import \((in the template|in the worker)\), (\d+\.\d\d) s the "
    r"rest \((?:the template's start, the first worker's fork|the first worker's start) and "
    r"warm-up, the front's servers\)"
)


@pytest.mark.parametrize("preload", ["on", "off"])
def test_the_start_is_measured_and_split(
    start: ServerFactory, tmp_path: Path, preload: str
) -> None:
    server = serve(start, tmp_path, "--workers", "2", "--preload", preload)
    wait_for_ready_workers(server, 2)
    record = server.wait_for_record(lambda r: START.fullmatch(r.get("message", "")))
    total, own, load, where, rest = START.fullmatch(record["message"]).groups()  # type: ignore[union-attr]
    assert where == ("in the template" if preload == "on" else "in the worker")
    assert 0 < float(own) < float(total) and float(load) > 0
    assert abs(float(own) + float(load) + float(rest) - float(total)) <= 0.02  # (rounding)
    samples = scrape(server)
    assert total_of(samples, "abeja_runtime_start_seconds", part="runtime") == pytest.approx(
        float(own), abs=0.01
    )
    assert total_of(samples, "abeja_runtime_start_seconds", part="ready") == pytest.approx(
        float(total), abs=0.01
    )
    how = "forked" if preload == "on" else "imported"
    assert total_of(samples, "abeja_runtime_worker_start_seconds_count", how=how) == 2
