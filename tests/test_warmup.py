"""The warm-up (``--warmup FILE``, ``ABEJA_RUNTIME_WARMUP``; ``worker/warmup.py``) through real
runtimes (issue 31, point 3): each worker sends the request files through its handler before
it counts as ready, a replacement too; a warm-up that fails keeps the worker out of readiness
and the front alive; a file that cannot be sent stops the start.

The ``wu_count`` handler answers with every call its process has had, warm-up calls included,
so that a client's answer says what came before it. The runtimes start in the test's folder,
where the warm-up files are, and serve the handler's folder (``ABEJA_USER_MODEL_ROOT``): the
files are read from the start directory, not from the code directory the workers run in.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from helpers.metrics import scrape, total
from helpers.servers import HANDLERS, RunningServer, ServerFactory, call_all, runtime_env
from helpers.waiting import wait_until
from helpers.workers import (
    alive,
    crash_a_worker,
    pid_of,
    ready_workers,
    wait_for_ready_workers,
)

from abeja_runtime.launch import runtime_command

#: The warm-up files of most tests: JSON and an image, as ``run-local --input`` sends them.
FILES = {"a.json": b'{"warm": true}', "b.jpg": b"\xff\xd8\xff\xe0 not really a JPEG"}
JSON_POST = ["POST", "application/json"]
JPEG_POST = ["POST", "image/jpeg"]
LOADED = re.compile(
    r"worker (\d+) (?:loaded the handler in \d+\.\d\d s|was forked from the template in "
    r"\d+\.\d{3} s \(the template loaded the handler in \d+\.\d\d s\)) and warmed it up "
    r"with (\d+) requests? in \d+\.\d\d s"
)
FAILED = re.compile(r"worker (\d+) failed its warm-up: (.*)")


def serve(
    make_server: ServerFactory,
    folder: Path,
    *flags: str,
    handler: str = "main:handler",
    code: str = "wu_count",
    env: dict[str, str] | None = None,
    wait: bool = True,
) -> RunningServer:
    """A runtime started in ``folder`` that serves the handler folder ``code``."""
    return make_server(
        code,
        "--handler",
        handler,
        *flags,
        cwd=folder,
        env={"ABEJA_USER_MODEL_ROOT": str(HANDLERS / code), **(env or {})},
        wait=wait,
    )


def write(folder: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        (folder / name).write_bytes(data)


def calls_of(answer: Any) -> list[dict[str, Any]]:
    """The calls that the answering process had had, this one last."""
    assert answer.status == 200, answer.body
    return answer.json()["calls"]


def messages(server: RunningServer, pattern: re.Pattern[str]) -> list[re.Match[str]]:
    return [
        match
        for record in server.records()
        if (match := pattern.fullmatch(str(record.get("message", ""))))
    ]


# --- every worker warm before its first call ------------------------------------------------------

STYLES = [
    # handler function, flags, how the files are given, the warm-up calls it gets
    pytest.param("handler", (), "flag", [[JSON_POST], [JPEG_POST]], id="def"),
    pytest.param("async_handler", (), "env", [[JSON_POST], [JPEG_POST]], id="async-def"),
    pytest.param(
        "batch", ("--max-batch-size", "4"), "flag", [[JSON_POST, JPEG_POST]], id="max-batch-size"
    ),
    pytest.param("declared", (), "env", [[JSON_POST, JPEG_POST]], id="declared-batched"),
]


@pytest.mark.parametrize(("function", "flags", "via", "warmed"), STYLES)
def test_each_worker_is_warmed_up_before_its_first_call(
    make_server, tmp_path, function, flags, via, warmed
):
    """Both workers had the warm-up calls (a batched handler as one batch) before any client
    call, with the content types of the files' names; an async handler's ran on the loop its
    calls run on. The log says how long each worker took to load and to warm up."""
    write(tmp_path, FILES)
    given = ["--warmup", "a.json", "--warmup", "b.jpg"] if via == "flag" else []
    env = {"ABEJA_RUNTIME_WARMUP": f"a.json{os.pathsep}b.jpg"} if via == "env" else {}
    server = serve(
        make_server, tmp_path, "--workers", "2", *flags, *given, handler=f"main:{function}", env=env
    )
    workers = wait_for_ready_workers(server, 2)
    answered: dict[int, list[dict[str, Any]]] = {}

    def both_answered() -> bool:
        for answer in call_all(server, ["/"] * 4):
            answered.setdefault(pid_of(answer), calls_of(answer))
        return len(answered) == 2

    wait_until(both_answered, 15, "answers from both workers")

    assert set(answered) == set(workers)
    for calls in answered.values():
        assert [call["requests"] for call in calls[: len(warmed)]] == warmed
        later = [request for call in calls[len(warmed) :] for request in call["requests"]]
        assert later and all(method == "GET" for method, _ in later), calls
        loops = {call["loop"] for call in calls}
        assert len(loops) == 1, calls  # None for a def handler: no loop
        assert (None in loops) == (function != "async_handler")
    loaded = {int(match[1]): match[2] for match in messages(server, LOADED)}
    assert loaded == {worker: "2" for worker in workers}


def test_a_kserve_model_is_warmed_up_through_its_style_on_the_loop_of_its_calls(
    make_server, tmp_path
):
    """A POST of the file to ``/``, as run-local sends it: the kserve style's inference."""
    pytest.importorskip("kserve", reason="the KServe style is tested against the kserve package")
    write(tmp_path, {"k.json": b'{"instances": [["warm"]]}'})
    server = serve(
        make_server, tmp_path, "--warmup", "k.json", code="wu_kserve", handler="model:CountingModel"
    )

    answer = server.post_json({"instances": [["client"]]}, path="/v1/models/model:predict")

    assert answer.status == 200, answer.body
    (prediction,) = answer.json()["predictions"]
    calls = prediction["calls"]
    assert [call["instances"] for call in calls] == [[["warm"]], [["client"]]]
    assert calls[0]["loop"] == calls[1]["loop"]


# --- replacements ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "how"),
    [
        pytest.param((), "crash", id="crashed"),
        pytest.param(("--max-requests", "1"), "serve", id="recycled"),
    ],
)
def test_a_replacement_is_warmed_up_before_it_answers(make_server, tmp_path, flags, how):
    write(tmp_path, FILES)
    server = serve(make_server, tmp_path, "--warmup", "a.json", *flags)
    (first,) = wait_for_ready_workers(server, 1)
    if how == "crash":
        assert crash_a_worker(server) == 502
    else:  # its one request served: it is replaced
        assert pid_of(server.request("GET", "/")) == first
    second = wait_for_ready_workers(server, 2)[1]

    answer = server.request("GET", "/")

    assert pid_of(answer) == second != first
    assert [call["requests"][0][0] for call in calls_of(answer)] == ["POST", "GET"]
    assert calls_of(answer)[0]["requests"] == [JSON_POST]


# --- a warm-up that fails -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fail", "answered"),
    [
        pytest.param("raise", '500 {"status": "unexpected error occurred"}', id="raises"),
        pytest.param("status", '400 {"no": 1}', id="answers-400"),
    ],
)
def test_a_failed_warmup_keeps_readiness_503_and_the_front_alive(
    make_server, tmp_path, fail, answered
):
    """The worker says why and exits; the front replaces it (with its back-off) rather than
    stop, as it does for a handler that cannot be imported."""
    write(tmp_path, {"fail.json": b'{"fail": "%s"}' % fail.encode()})
    server = serve(make_server, tmp_path, "--warmup", "fail.json", wait=False)

    failures = wait_until(
        lambda: (found := messages(server, FAILED)) and len(found) >= 2 and found,
        20,
        "two workers in a row to fail their warm-up",
    )

    first, second = failures[:2]
    assert first[1] != second[1]  # the first was replaced
    assert first[2] == (
        f"{tmp_path.resolve() / 'fail.json'} was answered {answered}; it stays out of readiness "
        "and exits, and the front starts a replacement, which warms up again"
    )
    assert server.process.poll() is None
    assert server.health() == 503
    assert ready_workers(server) == []
    # The front says the worker exited after its failed warm-up, not that it exited
    # unexpectedly, and counts it as such.
    replaced = server.wait_for_record(
        lambda r: r.get("message", "").startswith(f"worker {first[1]} exited")
    )
    assert replaced["log_level"] == "warning", replaced
    assert replaced["message"].startswith(f"worker {first[1]} exited after its failed warm-up;")
    samples = scrape(server)
    assert total(samples, "abeja_runtime_worker_restarts_total", reason="warmup_failed") >= 1
    assert total(samples, "abeja_runtime_worker_restarts_total", reason="crashed") == 0


def test_a_warmup_that_fails_once_heals_in_the_replacement(make_server, tmp_path):
    once = tmp_path / "failed-once"
    write(tmp_path, {"fail.json": b'{"fail": {"once": "%s"}}' % str(once).encode()})
    server = serve(make_server, tmp_path, "--warmup", "fail.json", wait=False)

    server.wait_healthy()

    # The ready line is read from the server's output by a thread of the test's own, which may
    # come to it after the health check saw the worker ready.
    (ready,) = wait_for_ready_workers(server, 1)
    ((failed, _),) = [match.groups() for match in messages(server, FAILED)]
    assert ready != int(failed)
    answer = server.request("GET", "/")
    assert pid_of(answer) == ready
    assert calls_of(answer)[0]["requests"] == [JSON_POST]


def test_a_retiring_workers_replacement_that_fails_is_replaced_and_the_pool_keeps_its_size(
    make_server, tmp_path
):
    """A worker recycled by --max-requests serves on until a replacement is ready; one that
    fails its warm-up is replaced in turn, and the retiree stops once that one is ready (it
    was left serving beside it: one worker too many, for good)."""
    once = tmp_path / "failed-once"
    once.touch()  # the first worker passes
    write(tmp_path, {"fail.json": b'{"fail": {"once": "%s"}}' % str(once).encode()})
    server = serve(make_server, tmp_path, "--warmup", "fail.json", "--max-requests", "1")
    (first,) = wait_for_ready_workers(server, 1)
    once.unlink()  # its first replacement fails, the next passes

    assert pid_of(server.request("GET", "/")) == first  # its one request: it retires

    wait_until(lambda: messages(server, FAILED), 20, "the replacement to fail its warm-up")
    second = wait_for_ready_workers(server, 2)[1]
    wait_until(lambda: not alive(first), 20, "the retiree to stop")
    assert pid_of(server.request("GET", "/")) == second


def test_readiness_waits_for_a_slow_first_call(make_server, tmp_path):
    """The handler is slow on its first call only: that call is the warm-up's, and readiness
    says 200 only once it is over."""
    write(tmp_path, FILES)
    started, release = tmp_path / "started", tmp_path / "release"
    env = {"WU_FIRST_STARTED": str(started), "WU_FIRST_RELEASE": str(release)}
    server = serve(make_server, tmp_path, "--warmup", "a.json", env=env, wait=False)

    wait_until(started.exists, 15, "the warm-up call to start")
    wait_until(lambda: server.health() == 503, 15, "the health check port to say 503")
    assert ready_workers(server) == []
    release.touch()
    server.wait_healthy()

    assert calls_of(server.request("GET", "/"))[0]["requests"] == [JSON_POST]


# --- files that cannot be sent --------------------------------------------------------------------

BAD_FILES = [
    pytest.param(
        "missing.json",
        None,
        "warm-up file not found: missing.json; check the path given to --warmup "
        "(ABEJA_RUNTIME_WARMUP)",
        id="missing",
    ),
    pytest.param(
        "broken.json",
        b'{"warm": ',
        "warm-up file broken.json is not valid JSON (Expecting value: line 1 column 10 (char 9)); "
        "fix it",
        id="not-json",
    ),
]


@pytest.mark.parametrize("via", ["flag", "env"])
@pytest.mark.parametrize(("name", "data", "message"), BAD_FILES)
def test_a_warmup_file_that_cannot_be_sent_stops_the_start_with_exit_2(
    tmp_path, via, name, data, message
):
    """Checked by the front before any worker starts: one line, as a bad setting is."""
    write(tmp_path, FILES)
    if data is not None:
        (tmp_path / name).write_bytes(data)
    given = ["--warmup", "a.json", "--warmup", name] if via == "flag" else []
    env = {"ABEJA_RUNTIME_WARMUP": f"a.json{os.pathsep}{name}"} if via == "env" else {}
    result = subprocess.run(
        runtime_command("--host", "127.0.0.1", "--port", "0", "--healthcheck-port", "0", *given),
        cwd=tmp_path,
        env=runtime_env(**env),
        capture_output=True,
        text=True,
        timeout=20,
        stdin=subprocess.DEVNULL,
        check=False,
    )

    assert (result.returncode, result.stderr) == (2, f"abeja-runtime: error: {message}\n")
    assert result.stdout == ""
