"""The workers of a runtime seen from outside: which are ready, alive, and how to crash one.

The ``sv_pid`` handler answers with the pid of the worker that ran it; ``?exit=1`` kills that
process the way a segfault would.
"""

from __future__ import annotations

import re
from pathlib import Path

from helpers.servers import Response, RunningServer
from helpers.waiting import wait_until

READY = re.compile(r"worker (\d+) is ready")


def ready_workers(server: RunningServer) -> list[int]:
    """Pids of the workers that the supervisor logged as ready, in order."""
    return [
        int(match.group(1))
        for record in server.records()
        if (match := READY.fullmatch(record.get("message", "")))
    ]


def wait_for_ready_workers(server: RunningServer, count: int) -> list[int]:
    def enough() -> list[int] | None:
        pids = ready_workers(server)
        return pids if len(pids) >= count else None

    return wait_until(enough, 15, f"{count} workers to be ready")


def handler_processes(front: int) -> set[int]:
    """The front's children that run the handler: all but the template (``--preload``)."""
    children = {
        int(child)
        for task in Path(f"/proc/{front}/task").iterdir()
        for child in (task / "children").read_text().split()
    }
    return {pid for pid in children if comm(pid) != "abeja-template"}


def comm(pid: int) -> str:
    """The process's name (``ps -o comm``); empty once it is gone."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or before the read
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited already


def pid_of(answer: Response) -> int:
    assert answer.status == 200, answer.body
    return answer.json()["pid"]


def crash_a_worker(server: RunningServer) -> int | str:
    """Send the request that kills its worker: the status, or the connection error's name.

    The client waits 30 s at most, half the default 60 s deadline: a ``502`` is the front
    answering for the dead worker, never a deadline's ``504`` (and a hang fails)."""
    try:
        return server.request("GET", "/?exit=1", timeout=30).status
    except ConnectionError as exc:  # includes http.client.RemoteDisconnected; a hang is not
        return type(exc).__name__
