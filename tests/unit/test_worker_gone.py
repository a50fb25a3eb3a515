"""A handler process's end, as the front's metrics see it (``FrontMetrics.worker_gone``): its
live gauges dropped, and prometheus_client imported only when it kept one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from abeja_runtime.metrics import handler_environment

_GONE = """
import sys
from abeja_runtime.metrics import FrontMetrics

metrics = FrontMetrics("0", "main:handler", "abeja", sys.argv[1], lambda: (0, 0))
metrics.worker_gone(int(sys.argv[2]))
print("prometheus_client" in sys.modules)
"""

_KEEPS_A_LIVE_GAUGE = """
import os
from prometheus_client import Gauge

Gauge("loaded_models", "models in memory", multiprocess_mode="livesum").set(2)
print(os.getpid())
"""


def _gone(directory: Path, pid: int) -> bool:
    """Whether the front's process imported prometheus_client to drop ``pid``'s gauges."""
    run = subprocess.run(
        [sys.executable, "-c", _GONE, str(directory), str(pid)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return run.stdout.strip() == "True"


def test_a_process_that_kept_no_live_gauge_costs_no_import(tmp_path: Path) -> None:
    (tmp_path / "counter_4242.db").write_bytes(b"")
    assert _gone(tmp_path, 4242) is False
    assert (tmp_path / "counter_4242.db").exists()  # its counters stay in the sums


def test_a_process_that_kept_a_live_gauge_has_it_dropped(tmp_path: Path) -> None:
    env = handler_environment(str(tmp_path))
    child = subprocess.run(
        [sys.executable, "-c", _KEEPS_A_LIVE_GAUGE],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env=env,
    )
    pid = int(child.stdout)
    assert list(tmp_path.glob(f"gauge_livesum_{pid}.db"))
    assert _gone(tmp_path, pid) is True
    assert not list(tmp_path.glob(f"gauge_livesum_{pid}.db"))
