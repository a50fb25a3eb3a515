"""The process tree of a server under test, read from /proc: its RSS and CPU time.

Linux only, like the rest of the benchmarks (wrk, taskset).
"""

from __future__ import annotations

import os
import threading
from typing import NamedTuple

__all__ = ["PAGE_TICKS", "ProcInfo", "TreeSampler", "proc_table", "tree_snapshot"]

#: Clock ticks per second, the unit of the CPU times in /proc/PID/stat.
PAGE_TICKS = os.sysconf("SC_CLK_TCK")


class ProcInfo(NamedTuple):
    """The /proc/PID/stat fields the harness needs."""

    state: str
    ppid: int
    pgrp: int
    cpu_ticks: int


def proc_table() -> dict[int, ProcInfo]:
    """pid -> ProcInfo for every process (zombies included), from /proc/*/stat."""
    table: dict[int, ProcInfo] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                raw = f.read()
        except OSError:
            continue  # exited while we were scanning
        # comm may contain spaces and parens; the fields we need follow the last ')'.
        fields = raw[raw.rfind(b")") + 2 :].split()
        table[int(entry.name)] = ProcInfo(
            fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[11]) + int(fields[12])
        )
    return table


def descendants(root: int, table: dict[int, ProcInfo]) -> list[int]:
    """root plus all its descendants that are alive in ``table``."""
    children: dict[int, list[int]] = {}
    for pid, info in table.items():
        children.setdefault(info.ppid, []).append(pid)
    out: list[int] = []
    stack = [root] if root in table else []
    while stack:
        pid = stack.pop()
        out.append(pid)
        stack.extend(children.get(pid, ()))
    return out


def rss_kib(pid: int) -> int | None:
    """VmRSS of one process in KiB, or None if it is gone (or a zombie without one)."""
    return _kib_field(f"/proc/{pid}/status", b"VmRSS:")


def pss_kib(pid: int) -> int | None:
    """The proportional set size of one process in KiB (its pages, with each shared page
    divided among the processes that map it), or None if it is gone."""
    return _kib_field(f"/proc/{pid}/smaps_rollup", b"Pss:")


def _kib_field(path: str, prefix: bytes) -> int | None:
    """The number on the first line of ``path`` that starts with ``prefix`` (``/proc`` files
    give kB), or None when the file or the line is not there."""
    try:
        with open(path, "rb") as f:
            for line in f:
                if line.startswith(prefix):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def peak_rss_kib(pid: int) -> int | None:
    """The most RSS one process has had, in KiB (``VmHWM``: the kernel's own high-water mark,
    since the process began or since :func:`reset_peak_rss`), or None if it is gone."""
    return _kib_field(f"/proc/{pid}/status", b"VmHWM:")


def reset_peak_rss(pid: int) -> None:
    """Start one process's ``VmHWM`` again from its RSS now (``clear_refs``: Linux 4.0)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "wb") as f:
            f.write(b"5")
    except OSError:
        pass  # gone meanwhile


def tree_snapshot(root: int, *, peak: bool = False) -> tuple[dict[int, int], int]:
    """(pid -> RSS KiB, CPU ticks) for the process tree under ``root``; ``peak``: each
    process's peak RSS (:func:`peak_rss_kib`) rather than its RSS now."""
    table = proc_table()
    pids = descendants(root, table)
    read = peak_rss_kib if peak else rss_kib
    rss = {pid: kib for pid in pids if (kib := read(pid)) is not None}
    return rss, sum(table[pid].cpu_ticks for pid in pids)


class TreeSampler:
    """Samples RSS of a process tree on a background thread and keeps the peaks.

    Reports both the peak of the sum (what the whole server costs) and the peak of the
    largest single process (what one worker costs; the sum double-counts shared pages), and
    the peak of the tree's summed PSS, which counts each shared page once (libpython and the
    other libraries both processes load, the shared-memory body buffers of the front and its
    workers).

    ``high_water``: the RSS peaks are the kernel's (each process's ``VmHWM``, started again
    when the sampler starts), which no sample can miss, so that the samples can be rare: a
    walk of ``/proc`` and each process's ``smaps_rollup`` ten times a second took 12-15 % of
    the runtime's throughput under load (three busy processes on two cores: the front, its
    worker and wrk) and 3 % of the bare app's. The peak of the sum is then the sum of each
    process's peak, which it can only overstate.
    """

    def __init__(self, root: int, interval: float = 0.1, *, high_water: bool = False) -> None:
        self.root = root
        self.interval = interval
        self.high_water = high_water
        self.peak_sum_kib = 0
        self.peak_single_kib = 0
        self.peak_pss_kib = 0
        self.max_procs = 0
        self.peak_by_pid: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def sample(self) -> dict[int, int]:
        """Take one sample now and fold it into the peaks."""
        rss, _ = tree_snapshot(self.root, peak=self.high_water)
        if rss:
            self.peak_sum_kib = max(self.peak_sum_kib, sum(rss.values()))
            self.peak_single_kib = max(self.peak_single_kib, max(rss.values()))
            self.max_procs = max(self.max_procs, len(rss))
            for pid, kib in rss.items():
                self.peak_by_pid[pid] = max(self.peak_by_pid.get(pid, 0), kib)
            pss = sum(share for pid in rss if (share := pss_kib(pid)) is not None)
            self.peak_pss_kib = max(self.peak_pss_kib, pss)
        return rss

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> TreeSampler:
        if self.high_water:
            for pid in tree_snapshot(self.root)[0]:
                reset_peak_rss(pid)
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sample()
