"""An installed aiohttp that lacks a private name the direct path needs: the runtime says so in one
warning at start and serves every request through aiohttp's public request handling.

Each test renames one name of ``PRIVATE_NAMES`` throughout a copy of aiohttp's Python sources,
as an aiohttp release that renamed it would (the copy has no C extensions: their names cannot be
changed), and starts a runtime that imports that copy."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import aiohttp
import pytest
from helpers.servers import ServerFactory

from abeja_runtime.front.aiohttp_private import PRIVATE_NAMES

NAMES = [f"{owner}.{name}" for owner, names in PRIVATE_NAMES.items() for name in names]
#: Above the largest body that travels in the call frame (64 KiB).
BIG_BODY = 100 * 1024


def renamed_aiohttp(folder: Path, name: str) -> Path:
    """A folder to import aiohttp from, whose aiohttp calls ``name`` ``<name>_gone``."""
    copy = folder / "aiohttp"
    shutil.copytree(
        Path(aiohttp.__file__).parent,
        copy,
        ignore=shutil.ignore_patterns("*.so", "*.pyd", "*.c", "*.pyx", "__pycache__"),
    )
    word = re.compile(rf"\b{re.escape(name)}\b")
    for source in copy.rglob("*.py"):
        text = source.read_text(encoding="utf-8")
        source.write_text(word.sub(f"{name}_gone", text), encoding="utf-8")
    return folder


@pytest.mark.parametrize("missing", NAMES)
def test_requests_are_answered_through_aiohttps_public_path(
    make_server: ServerFactory, tmp_path: Path, missing: str
) -> None:
    owner, _, name = missing.rpartition(".")
    folder = renamed_aiohttp(tmp_path / "site", name)
    paths = [str(folder), *filter(None, [os.environ.get("PYTHONPATH")])]
    server = make_server(
        "er_mixed",
        env={"PYTHONPATH": os.pathsep.join(paths), "AIOHTTP_NO_EXTENSIONS": "1"},
    )

    small = server.post_json({"total_without_tax": 100})
    assert (small.status, small.json()["size"]) == (200, 26)
    big = server.request("POST", "/", b"x" * BIG_BODY, {"Content-Type": "text/plain"})
    assert (big.status, big.json()["size"]) == (200, BIG_BODY)
    streamed = server.request("GET", "/?mode=stream")
    assert (streamed.status, streamed.body) == (200, b"line 0\nline 1\nline 2\n")

    def warns(record: dict[str, str]) -> bool:
        return "which the direct path needs" in record.get("message", "")

    server.wait_for_record(warns)  # (its line may come after the answers: another pipe)
    said = [record for record in server.records() if warns(record)]
    assert len(said) == 1, said
    assert said[0]["log_level"] == "warning"
    assert said[0]["message"].startswith(f"the installed aiohttp {aiohttp.__version__} lacks ")
    assert f"{owner}.{name}," in said[0]["message"]
    assert "through aiohttp's public request handling" in said[0]["message"]
