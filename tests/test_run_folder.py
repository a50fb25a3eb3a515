"""The front's one folder under TMPDIR: removed when it stops, swept by the next start when it
was killed, never while its front runs (issue 28 point 9)."""

from __future__ import annotations

import signal
from pathlib import Path

from helpers.servers import ServerFactory
from helpers.waiting import wait_until


def run_folders(tmp: Path) -> set[Path]:
    return {entry for entry in tmp.iterdir() if entry.name.startswith("abeja-runtime-")}


def test_a_killed_front_s_folder_is_swept_by_the_next_start(
    make_server: ServerFactory, tmp_path: Path
):
    killed = make_server("rq_echo")  # its TMPDIR is tmp_path
    (left,) = run_folders(tmp_path)
    assert (left / "metrics").is_dir()
    assert killed.request("POST", "/", b"x" * 4096).status == 200
    killed.process.send_signal(signal.SIGKILL)
    killed.process.wait(10)
    assert left.exists()  # nothing removes it on SIGKILL

    running = make_server("rq_echo")
    record = running.wait_for_record(lambda r: "left by an abeja-runtime" in r.get("message", ""))
    assert record["message"] == f"removed {left}, left by an abeja-runtime that was killed"
    assert not left.exists()
    (own,) = run_folders(tmp_path)

    another = make_server("rq_echo")  # a start beside a running front leaves its folder
    assert own.exists() and len(run_folders(tmp_path)) == 2
    assert running.request("POST", "/", b"x" * 4096).status == 200

    assert running.stop() == 0 and another.stop() == 0
    wait_until(lambda: not run_folders(tmp_path), 10, "both folders removed at the stops")
