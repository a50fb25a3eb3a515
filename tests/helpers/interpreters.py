"""Code run in a fresh interpreter: what a process imports, or makes, on its own."""

from __future__ import annotations

import subprocess
import sys


def printed_by(code: str) -> str:
    """What ``code`` prints, run by this Python in a fresh interpreter (bounded); the test fails
    with its error output when it fails."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout
