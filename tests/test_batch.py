"""``abeja-runtime batch``: the handler once per input, from files or from INPUT/OUTPUT.

The real command in a subprocess; the DataLake is a local HTTP server standing in for the
platform API, which records what it is sent.
"""

from __future__ import annotations

import base64
import http.server
import json
import os
import pty
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helpers.servers import HANDLERS, runtime_env

from abeja_runtime.launch import runtime_command

SAMPLES = Path(__file__).parent.parent / "samples"


def batch(
    cwd: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        runtime_command("batch", *args),
        cwd=cwd,
        env=runtime_env(**(env or {})),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def records(stderr: str) -> list[dict]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


def test_a_folder_of_inputs_gives_one_answer_per_input_and_a_summary(tmp_path):
    inputs = tmp_path / "in"
    (inputs / "more").mkdir(parents=True)
    (inputs / "a.json").write_text('{"total_without_tax": 100}')
    (inputs / "more" / "b.json").write_text('{"total_without_tax": 50}')
    (inputs / ".hidden.json").write_text("{}")
    single = tmp_path / "c.json"
    single.write_text('{"total_without_tax": 10}')

    done = batch(SAMPLES / "tax", str(inputs), str(single), "--output", str(tmp_path / "out"))

    assert done.returncode == 0, done.stderr
    assert done.stdout == ""  # logs, progress and summary are on stderr
    answers = {
        str(path.relative_to(tmp_path / "out")): json.loads(path.read_text())
        for path in (tmp_path / "out").rglob("*")
        if path.is_file()
    }
    assert answers == {
        "a.json.json": {"total": 108.0},
        "more/b.json.json": {"total": 54.0},
        "c.json.json": {"total": 10.8},
    }
    assert "batch finished: 3 input(s): 3 answered 2xx, in " in done.stderr
    paths = sorted(r["http_path"] for r in records(done.stderr) if r.get("log_type"))
    assert paths == ["a.json", "c.json", "more/b.json"]


def test_an_answer_above_299_makes_the_exit_code_1_and_is_named(tmp_path):
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "good.json").write_text('{"total_without_tax": 1}')
    (inputs / "bad.json").write_text('{"no": "field"}')
    (inputs / "broken.txt").write_text("not json")

    done = batch(SAMPLES / "tax", str(inputs), "--output", str(tmp_path / "out"))

    assert done.returncode == 1, done.stderr
    assert "3 input(s): 1 answered 2xx, 2 failed (400: 1, 500: 1): bad.json, broken.txt" in (
        done.stderr
    )
    assert json.loads((tmp_path / "out" / "bad.json.json").read_text()) == {
        "message": "total_without_tax is need"
    }
    assert json.loads((tmp_path / "out" / "broken.txt.json").read_text()) == {
        "status": "unexpected error occurred"
    }


def test_input_json_is_one_post_answered_on_stdout(tmp_path):
    done = batch(SAMPLES / "tax", env={"INPUT": '{"total_without_tax": 200}'})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"total": 216.0}

    refused = batch(SAMPLES / "tax", env={"INPUT": '{"other": 1}'})
    assert refused.returncode == 1
    assert json.loads(refused.stdout) == {"message": "total_without_tax is need"}


def test_an_empty_input_is_a_request_without_contents(tmp_path):
    done = batch(HANDLERS / "rq_echo", env={"INPUT": ""})
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert (seen["http_method"], seen["content_type"], seen["contents"]) == ("POST", "", [])


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("[1", "INPUT is not JSON"),
        ('"text"', "INPUT must be a JSON object or array, not str"),
        (
            '{"$datalake:1": "c1/f1"}',
            "INPUT or OUTPUT names the DataLake, but ABEJA_API_URL is not set",
        ),
    ],
)
def test_an_input_that_cannot_be_a_request_is_a_clear_error(value, message):
    done = batch(SAMPLES / "tax", env={"INPUT": value})
    assert done.returncode == 1
    assert f"batch failed: {message}" in done.stderr


def test_missing_inputs_and_unloadable_handlers_stop_with_a_message(tmp_path):
    missing = batch(SAMPLES / "tax", str(tmp_path / "nope"))
    assert missing.returncode == 2
    assert f"abeja-runtime: error: {tmp_path / 'nope'}: no such file or folder" in missing.stderr

    empty = tmp_path / "empty"
    empty.mkdir()
    nothing = batch(SAMPLES / "tax", str(empty))
    assert nothing.returncode == 2
    assert "no input files in" in nothing.stderr

    unloadable = batch(HANDLERS / "ld_import_error", env={"INPUT": "{}"})
    assert unloadable.returncode == 1
    assert any(
        r.get("message", "").startswith("failed to setup model") for r in records(unloadable.stderr)
    )


@dataclass
class DataLakeStandIn:
    url: str
    uploads: list[tuple[str, dict[str, str], bytes]] = field(default_factory=list)
    gets: list[tuple[str, str | None]] = field(default_factory=list)


@pytest.fixture
def datalake() -> Iterator[DataLakeStandIn]:
    state: dict[str, DataLakeStandIn] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            lake = state["lake"]
            lake.gets.append((self.path, self.headers.get("Authorization")))
            if self.path == "/channels/c1/f1":
                info = {
                    "download_uri": f"{lake.url}/blobs/f1",
                    "content_type": "image/png",
                    "metadata": {"x-abeja-meta-label": "cat"},
                }
                self._answer(200, json.dumps(info).encode(), "application/json")
            elif self.path == "/blobs/f1":
                self._answer(200, b"\x89PNG-bytes", "application/octet-stream")
            else:
                self._answer(404, b'{"error": "not_found"}', "application/json")

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            state["lake"].uploads.append((self.path, dict(self.headers), body))
            self._answer(201, b"{}", "application/json")

        def _answer(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state["lake"] = DataLakeStandIn(f"http://127.0.0.1:{server.server_address[1]}")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state["lake"]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_a_datalake_input_is_downloaded_and_the_answer_uploaded(datalake):
    env = {
        "INPUT": '{"$datalake:1": "c1/f1"}',
        "OUTPUT": '{"$datalake:1": "c2"}',
        "ABEJA_API_URL": datalake.url,
        "ABEJA_RUN_ID": "run-9",
        "ABEJA_PLATFORM_USER_ID": "1234",
        "ABEJA_PLATFORM_PERSONAL_ACCESS_TOKEN": "secret",
    }
    done = batch(HANDLERS / "rq_echo", env=env)

    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    expected_auth = "Basic " + base64.b64encode(b"user-1234:secret").decode()
    assert datalake.gets[0] == ("/channels/c1/f1", expected_auth)
    ((path, headers, body),) = datalake.uploads
    assert path == "/channels/c2/upload?conflict_target=filename"
    assert headers["Authorization"] == expected_auth
    assert headers["Content-Type"] == "application/json"
    assert headers["x-abeja-meta-filename"] == "run-9_0.json"
    seen = json.loads(body)
    assert seen["content_type"] == "image/png"
    (content,) = seen["contents"]
    assert content["metadata"] == {"x-abeja-meta-label": "cat"}
    assert base64.b64decode(content["body"]) == b"\x89PNG-bytes"


def test_a_datalake_error_is_said_with_what_the_api_answered(datalake):
    env = {"INPUT": '{"$datalake:1": "c1/missing"}', "ABEJA_API_URL": datalake.url}
    done = batch(HANDLERS / "rq_echo", env=env)
    assert done.returncode == 1
    assert "the DataLake answered 404" in done.stderr
    assert datalake.uploads == []


def test_on_a_terminal_there_is_a_progress_bar_and_the_summary_in_words(tmp_path):
    """stderr a pseudo-terminal, as when a person runs the command."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    for number in range(3):
        (inputs / f"{number}.json").write_text('{"total_without_tax": 1}')
    controller, terminal = pty.openpty()
    try:
        done = subprocess.run(
            runtime_command("batch", str(inputs), "--output", str(tmp_path / "out")),
            cwd=SAMPLES / "tax",
            env=runtime_env(),
            stdout=subprocess.PIPE,
            stderr=terminal,
            timeout=120,
            check=False,
        )
        os.close(terminal)
        shown = b""
        while chunk := _read_available(controller):
            shown += chunk
    finally:
        os.close(controller)
    text = shown.decode("utf-8", "replace")
    assert done.returncode == 0
    assert "batch  [------------------------------------]  0/3" in text, text
    assert "batch  [####################################]  3/3" in text
    assert "batch: 3 input(s): 3 answered 2xx, in " in text


def _read_available(fd: int) -> bytes:
    """What the terminal holds; b"" once the writer is gone (EIO on Linux) or nothing is left."""
    try:
        return os.read(fd, 65536)
    except OSError:
        return b""
