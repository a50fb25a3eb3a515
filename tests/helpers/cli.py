"""Helpers of the CLI tests: run the real ``abeja`` command and look at what it left.

Imported by the CLI test modules and by ``tests/cli/conftest.py`` (``from helpers.cli import
...``): never ``from conftest import``, which would pick whichever conftest module pytest
imported last.
"""

from __future__ import annotations

import contextlib
import io
import os
import queue
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "samples"
PROJECTS = REPO / "tests" / "cli" / "projects"
REQUIRE_DOCKER = os.environ.get("ABEJA_REQUIRE_DOCKER") == "1"
BASE_IMAGE = os.environ.get("BASE_IMAGE", "python:3.11-slim")
LABEL = "org.abeja-runtime"
#: Bound on one CLI run. A first Docker build (wheels, runtime image, pip) takes well under it.
CLI_TIMEOUT = 240.0


def cli_env(**extra: str) -> dict[str, str]:
    """The environment for a CLI run: ours, minus variables that would change its behaviour."""
    unset = ("ABEJA_ENGINE", "ABEJA_IMAGE", "HANDLER", "PORT")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


@dataclass(repr=False)
class Result:
    returncode: int
    stdout: bytes
    stderr: str

    @property
    def text(self) -> str:
        return self.stdout.decode("utf-8")

    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith("[error]")]

    def __repr__(self) -> str:  # shown by pytest when an assertion on the result fails
        out = f"--- stdout ---\n{self.stdout!r}\n--- stderr ---\n{self.stderr}"
        return f"exit {self.returncode}\n{out}"


def run_abeja(
    *args: str,
    cwd: Path,
    env: dict[str, str] | None = None,
    stdin: bytes | None = None,
    timeout: float = CLI_TIMEOUT,
) -> Result:
    proc = subprocess.run(
        [sys.executable, "-m", "abeja_cli", *args],
        cwd=cwd,
        env=env or cli_env(),
        input=stdin if stdin is not None else b"",
        capture_output=True,
        timeout=timeout,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr.decode("utf-8", "replace"))


@dataclass
class CliProcess:
    """A CLI running in the background; its output lines are collected as they come."""

    process: subprocess.Popen[bytes]
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    _events: queue.Queue[None] = field(default_factory=queue.Queue)

    def _read(self, stream: Any, lines: list[str]) -> None:
        with stream:
            for raw in stream:
                lines.append(raw.decode("utf-8", "replace").rstrip("\n"))
                self._events.put(None)
        self._events.put(None)

    def output(self) -> str:
        return "\n".join(self.stdout) + "\n--- stderr ---\n" + "\n".join(self.stderr)

    def mark(self) -> tuple[int, int]:
        """A position in the output; ``wait_for(..., since=mark)`` looks only after it."""
        return len(self.stdout), len(self.stderr)

    def wait_for(
        self,
        pattern: str,
        *,
        timeout: float = CLI_TIMEOUT,
        stream: str = "any",
        since: tuple[int, int] = (0, 0),
    ) -> str:
        """Block until a line matches ``pattern``; fail if the CLI exits or time runs out."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            lines = []
            if stream in ("any", "stdout"):
                lines += self.stdout[since[0] :]
            if stream in ("any", "stderr"):
                lines += self.stderr[since[1] :]
            for line in lines:
                if regex.search(line):
                    return line
            if self.process.poll() is not None and self._events.empty():
                raise AssertionError(
                    f"CLI exited ({self.process.returncode}) before {pattern!r}:\n{self.output()}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"timed out waiting for {pattern!r}:\n{self.output()}")
            with contextlib.suppress(queue.Empty):
                self._events.get(timeout=min(remaining, 1.0))

    def send(self, sig: int) -> None:
        self.process.send_signal(sig)

    def wait(self, timeout: float = 60.0) -> int:
        code = self.process.wait(timeout)
        return code

    def endpoint(self) -> str:
        line = self.wait_for(r"Endpoint : http://", stream="stdout")
        return line.split("Endpoint : ", 1)[1].strip()


def http_request(
    url: str, data: bytes | None = None, *, method: str | None = None, timeout: float = 30.0
) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()


def copy_project(name: str, dest_root: Path) -> Path:
    source = SAMPLES / name if (SAMPLES / name).is_dir() else PROJECTS / name
    dest, n = dest_root / name, 1
    while dest.exists():  # a second copy in the same test is another project
        n += 1
        dest = dest_root / f"{name}-{n}"
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns("__pycache__"))
    return dest.resolve()


def ours(client: Any, project: Path, kind: str = "containers") -> list[Any]:
    """Containers (or images) the CLI made for ``project``, found by their label."""
    filters = {"label": f"{LABEL}.project={project}"}
    if kind == "containers":
        return list(client.containers.list(all=True, filters=filters))
    return list(client.images.list(filters=filters))


def remove_project_images(client: Any, root: Path) -> None:
    """Remove the project images the CLI built for projects under ``root`` (and their
    containers). Production images are built on them: the ``production_image`` fixture, the
    one test that builds one, removes it first."""
    from docker.errors import APIError

    # The low-level listing: images.list() fetches each image again, and fails on one that
    # another test process removed in between.
    for image in client.api.images(filters={"label": f"{LABEL}.kind=project"}):
        if (image.get("Labels") or {}).get(f"{LABEL}.project", "").startswith(str(root)):
            with contextlib.suppress(APIError):
                for container in client.containers.list(
                    all=True, filters={"ancestor": image["Id"]}
                ):
                    container.remove(force=True)
                client.images.remove(image["Id"], force=True)


def assert_flipped(original: Path, answer: bytes) -> None:
    from PIL import Image, ImageChops, ImageStat

    flipped = Image.open(io.BytesIO(answer))
    assert flipped.format == "JPEG"
    source = Image.open(original).convert("RGB")
    assert flipped.size == source.size
    mirrored = source.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    near = max(ImageStat.Stat(ImageChops.difference(flipped.convert("RGB"), mirrored)).mean)
    far = max(ImageStat.Stat(ImageChops.difference(flipped.convert("RGB"), source)).mean)
    assert near < 3 < far, (near, far)  # JPEG is lossy: close to the mirror, far from the input


HELD_WHEEL = "abeja_test_held-1.0-py3-none-any.whl"


def _wheel() -> bytes:
    """A minimal pure-Python wheel of ``abeja-test-held`` 1.0 (an empty package)."""
    import base64
    import hashlib
    import zipfile

    info = "abeja_test_held-1.0.dist-info"
    files = {
        "abeja_test_held/__init__.py": b"",
        f"{info}/METADATA": b"Metadata-Version: 2.1\nName: abeja-test-held\nVersion: 1.0\n",
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: abeja-tests\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    files[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return buffer.getvalue()


class HeldIndex:
    """A package index on this machine whose one package downloads only once released: an
    install that takes as long as the test wants, with pip on the step it is at.

    ``requirements(host)`` are the lines of a requirements.txt that installs it from ``host``
    (where the installing process reaches this machine: 127.0.0.1, or a Docker bridge's
    gateway for a build).
    """

    def __init__(self, bind: str = "127.0.0.1", *, hold: float = CLI_TIMEOUT) -> None:
        import hashlib
        import http.server
        import threading

        wheel = _wheel()
        self.released = threading.Event()
        self.downloads = 0
        page = (
            f'<a href="/files/{HELD_WHEEL}#sha256={hashlib.sha256(wheel).hexdigest()}">'
            f"{HELD_WHEEL}</a>"
        ).encode()
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.rstrip("/") == "/simple/abeja-test-held":
                    body, kind = page, "text/html"
                elif self.path == f"/files/{HELD_WHEEL}":
                    body, kind = wheel, "application/octet-stream"
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if kind != "text/html":
                    index.downloads += 1
                    self.wfile.flush()  # pip has the headers: it says "Downloading ..."
                    index.released.wait(hold)
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer((bind, 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def requirements(self, host: str) -> str:
        return (
            f"--index-url=http://{host}:{self.port}/simple/\n"
            f"--trusted-host={host}\n"
            "abeja-test-held==1.0\n"
        )

    def release(self) -> None:
        self.released.set()

    def close(self) -> None:
        self.released.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)


def readme_run_local(project: Path) -> list[str]:
    line = next(
        line
        for line in (project / "README.md").read_text().splitlines()
        if line.startswith("abeja model run-local ")
    )
    return shlex.split(line)[1:]


#: What run-local with ``-h main:chatty`` of the responder project shows on stderr (each line
#: up to its first " ("), in the order it must: the request sent, the handler's lines as it
#: wrote them, the request's access record, the server's stop, the line before the answer.
CHATTY_RUN = [
    "[info] sending request to model: POST / request.json",
    *[f"{way} {number}" for number in range(1, 201) for way in ("printed", "on stderr")],
    "access: POST / 200",
    "signal SIGTERM received; shutting down gracefully",
    "[info] finish requesting to model: 200 OK",
]


def chatty_run(stderr: str) -> list[str]:
    """The lines of :data:`CHATTY_RUN` that a run's stderr shows, in its order."""
    shown = [line.split(" (")[0] for line in stderr.splitlines()]
    return [line for line in shown if line in CHATTY_RUN]
