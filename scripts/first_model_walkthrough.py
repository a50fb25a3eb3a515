"""Walk through docs/first-model.md literally, as a new user would, on a machine without Docker.

Its files (main.py, request.json) and commands are taken from the document itself, so a step
that stops working, or a document that drifts from what the tools do, fails here:

1-2. (install: done by the README's command) the handler and its request, in a new folder;
3.   `abeja model run-local ...` answers what the document shows;
4.   `abeja model run-local-server ... -p 8080`, the document's curl, then Ctrl+C;
5.   a requirements.txt, and run-local again (the local engine installs it);
6.   `abeja model manifests ...` (build and docker run need Docker: not here).

Run from the repository root (scripts/readme-without-docker.sh does, in a clean container):
    python scripts/first_model_walkthrough.py
"""

from __future__ import annotations

import json
import queue
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO

DOC = Path(__file__).resolve().parent.parent / "docs" / "first-model.md"
#: Bound on each step (the first run-local with requirements installs numpy).
STEP_TIMEOUT = 300.0


def blocks(text: str) -> list[tuple[int, str, str]]:
    """The fenced blocks of ``text``: (offset of the opening fence, language, body)."""
    found = []
    for match in re.finditer(r"^```(\w*)\n(.*?)^```$", text, re.DOTALL | re.MULTILINE):
        found.append((match.start(), match.group(1), match.group(2)))
    return found


def block_after(text: str, marker: str, language: str) -> str:
    """The first block in ``language`` ("" for none) after ``marker``."""
    start = text.index(marker)
    for offset, kind, body in blocks(text):
        if offset > start and kind == language:
            return body
    raise AssertionError(f"no {language or 'plain'} block after {marker!r} in {DOC}")


def command_starting(text: str, prefix: str) -> list[str]:
    """The first line of an sh block that starts with ``prefix``, as argv."""
    for _, kind, body in blocks(text):
        for line in body.splitlines() if kind == "sh" else ():
            if line.startswith(prefix):
                return shlex.split(line.split(" #")[0])
    raise AssertionError(f"no command starting with {prefix!r} in {DOC}")


def step(title: str) -> None:
    print(f"== first-model.md: {title}", flush=True)


def run(argv: list[str], cwd: Path) -> str:
    done = subprocess.run(
        argv, cwd=cwd, capture_output=True, text=True, timeout=STEP_TIMEOUT, check=False
    )
    assert done.returncode == 0, f"{shlex.join(argv)} exited {done.returncode}:\n{done.stderr}"
    return done.stdout


def main() -> int:
    text = DOC.read_text("utf-8")
    folder = Path(tempfile.mkdtemp()) / "my-model"
    folder.mkdir()
    step("2. write a handler")
    (folder / "main.py").write_text(block_after(text, "`main.py`:", "python"))
    (folder / "request.json").write_text(block_after(text, "`request.json`:", "json"))

    step("3. send it one request")
    answer = json.loads(run(command_starting(text, "abeja model run-local "), folder))
    shown = json.loads(block_after(text, "## 3. Send it one request", ""))
    assert answer == shown, f"run-local answered {answer}, the document shows {shown}"

    step("4. serve it")
    serve(text, folder, shown)

    step("5. add a library")
    (folder / "requirements.txt").write_text("numpy\n")
    again = json.loads(run(command_starting(text, "abeja model run-local "), folder))
    assert again == shown, again

    step("6. manifests (build and docker run need Docker)")
    manifests = command_starting(text, "abeja model manifests ")
    target = manifests.index(">")
    yaml = run(manifests[:target], folder)
    assert "kind: Deployment" in yaml, yaml[:500]
    print("first-model.md: every step worked", flush=True)
    return 0


def serve(text: str, folder: Path, shown: dict[str, object]) -> None:
    server = subprocess.Popen(
        command_starting(text, "abeja model run-local-server "),
        cwd=folder,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert server.stdout is not None
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=pump, args=(server.stdout, lines), daemon=True).start()
    try:
        deadline = time.monotonic() + STEP_TIMEOUT
        seen: list[str] = []
        while not any("Endpoint :" in line for line in seen):  # the banner: the model is ready
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            assert line is not None, "run-local-server ended before its banner:\n" + "".join(seen)
            seen.append(line)
        curl = command_starting(text, "curl ")
        answer = json.loads(run(curl, folder))
        assert answer == shown, f"curl got {answer}"
    finally:
        server.send_signal(signal.SIGINT)  # Ctrl+C
        code = server.wait(60)
    assert code == 0, f"run-local-server exited {code} after Ctrl+C"


def pump(stream: IO[str], lines: queue.Queue[str | None]) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


if __name__ == "__main__":
    sys.exit(main())
