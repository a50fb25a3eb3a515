"""Fixtures that start the real runtime as a subprocess on 127.0.0.1 and stop it afterwards.

Only fixtures live here; what the tests import (``RunningServer``, ``wait_until``, ...) is in the
``helpers`` package next to this file (``from helpers.servers import ...``).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.servers import ServerFactory

# The runtimes tests start themselves (with the environment they inherit) have no balancer in
# front to wait for at their stop; the drain tests give their own delay.
os.environ.setdefault("ABEJA_RUNTIME_DRAIN_DELAY", "0")


@pytest.fixture(autouse=True)
def _collect_garbage() -> Iterator[None]:
    """Collect after each test, so that what a test left unclosed (a client's socket) fails
    that test with its ``ResourceWarning`` (warnings are errors), not a later one at random."""
    yield
    gc.collect()


@pytest.fixture
def make_server(tmp_path: Path) -> Iterator[ServerFactory]:
    """Start a runtime for one test; ``TMPDIR`` of the server is the test's tmp_path."""
    factory = ServerFactory(tmp_path)
    yield factory
    factory.stop_all()


@pytest.fixture(scope="module")
def make_module_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerFactory]:
    """The same for servers shared by a module's tests (e.g. one per parametrised table)."""
    factory = ServerFactory(tmp_path_factory.mktemp("server"))
    yield factory
    factory.stop_all()


@pytest.fixture
def start(make_server: ServerFactory) -> ServerFactory:
    """``make_server`` under the name the pool and execution tests use."""
    return make_server
