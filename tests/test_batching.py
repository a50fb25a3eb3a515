"""Adaptive batching (``--max-batch-size``), over real HTTP (issue 30).

The handler (``tests/handlers/bt_batch``) answers each request with the ids of the batch it came
in and what it saw of its own request, so that a test can tell which requests shared a call and
that nothing was mixed between them. A worker is made busy by a request that waits for a file
the test creates: what the test sends meanwhile gathers in the queue. No timing is asserted:
where a wait matters (``--max-batch-wait``), the test tells it by what was answered before what.
"""

from __future__ import annotations

import json
import shlex
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import ServerFactory
from helpers.metrics import scrape, total
from helpers.raw_http import get, printed, records_of, send_and_leave
from helpers.servers import HANDLERS, Response, RunningServer, runtime_env
from helpers.waiting import wait_until

from abeja_runtime.config import Config
from abeja_runtime.launch import runtime_command

BATCHED = {"def": "main:handler", "async": "main:async_handler"}


def ask(server: RunningServer, call_id: str, query: str = "", **kwargs: Any) -> Response:
    body = json.dumps([call_id, "a list is one request"]).encode()
    headers = {"Content-Type": "application/json", "x-tag": f"tag-{call_id}"}
    path = f"/?id={call_id}{query}"
    return server.request("POST", path, body, headers, **kwargs)


class Asked:
    """Requests sent on threads; their answers by id."""

    def __init__(self, server: RunningServer) -> None:
        self._server = server
        self.answers: dict[str, Response] = {}
        self._threads: list[threading.Thread] = []

    def send(self, call_id: str, query: str = "") -> None:
        def run() -> None:
            self.answers[call_id] = ask(self._server, call_id, query)

        thread = threading.Thread(target=run)
        thread.start()
        self._threads.append(thread)

    def wait(self) -> dict[str, Response]:
        for thread in self._threads:
            thread.join(60)
            assert not thread.is_alive(), "a request was never answered"
        return self.answers


def batches(server: RunningServer) -> list[list[str]]:
    return [event["ids"] for event in printed(server) if event.get("event") == "batch"]


def batch_with(server: RunningServer, call_id: str) -> list[str]:
    """The ids of the batch ``call_id`` came in, once its worker's log line has arrived (it
    may come after the answers)."""
    found = wait_until(
        lambda: [batch for batch in batches(server) if call_id in batch], 20, call_id
    )
    return list(found[-1])


def busy(server: RunningServer, tmp_path: Path, asked: Asked) -> Path:
    """Make the worker busy: a request that holds its call until the returned file exists."""
    release = tmp_path / "release"
    asked.send("holder", f"&hold={release}")
    wait_until(lambda: ["holder"] in batches(server), 20, "the holder's call")
    return release


def two_slots(make_server: ServerFactory, size: int, wait: float) -> RunningServer:
    """An async batched handler whose worker runs two batches at once."""
    return make_server(
        "bt_batch", "--handler", "main:async_handler", "--concurrency", "2",
        "--max-batch-size", str(size), "--max-batch-wait", str(wait),
    )  # fmt: skip


def queued(server: RunningServer, count: int) -> Callable[[], bool]:
    """``count`` calls in flight: the one running (the holder's) and the rest in the queue,
    where a batch finds them (in flight alone, a call may still be on its way there)."""
    return lambda: server.in_flight() >= count and server.queued() >= count - 1


@pytest.mark.parametrize("style", ["def", "async"])
def test_requests_that_wait_for_a_busy_worker_go_in_one_call_each_answered_as_its_own(
    make_server: ServerFactory, tmp_path: Path, style: str
):
    server = make_server(
        "bt_batch", "--handler", BATCHED[style], "--max-batch-size", "8",
        "--max-batch-wait", "30",
    )  # fmt: skip
    asked = Asked(server)
    release = busy(server, tmp_path, asked)
    for index in range(5):
        asked.send(f"r{index}", f"&n={index}")
    wait_until(queued(server, 6), 20, "the five requests queued")
    release.touch()
    answers = asked.wait()
    ids = [f"r{index}" for index in range(5)]
    assert sorted(batch_with(server, "r0")) == ids  # one call for the five (it was idle)
    for index, call_id in enumerate(ids):
        answer = answers[call_id]
        assert answer.status == 200, answer.body
        got = answer.json()
        assert sorted(got["batch"]) == ids
        # Its own parameters, headers, body and metadata: nothing of a neighbour's.
        assert got["id"] == call_id and got["tag"] == f"tag-{call_id}"
        assert got["query"] == {"id": call_id, "n": str(index)}
        assert json.loads(got["body"]) == [call_id, "a list is one request"]
        assert answer.headers["x-id"] == call_id
    samples = scrape(server)
    assert total(samples, "abeja_runtime_batches_total", reason="idle") >= 2
    assert total(samples, "abeja_runtime_batch_size_count") >= 2
    assert total(samples, "abeja_runtime_batch_size_sum") >= 6
    assert total(samples, "abeja_runtime_batch_wait_seconds_count") >= 6


def test_a_handler_declared_batched_in_its_module_gets_batches(
    make_server: ServerFactory, tmp_path: Path
):
    """``@abeja_runtime.batched(max_size=8, max_wait=30)`` and no setting: batches all the
    same, with the batch metrics."""
    server = make_server("bt_batch", "--handler", "main:declared")
    asked = Asked(server)
    release = busy(server, tmp_path, asked)
    for index in range(3):
        asked.send(f"d{index}")
    wait_until(queued(server, 4), 20, "the three requests queued")
    release.touch()
    answers = asked.wait()
    assert sorted(batch_with(server, "d0")) == ["d0", "d1", "d2"]
    assert all(answers[f"d{index}"].status == 200 for index in range(3))
    assert total(scrape(server), "abeja_runtime_batches_total", reason="idle") >= 2


def test_a_lone_request_pays_no_wait(make_server: ServerFactory):
    """``--max-batch-wait 60``: an idle worker takes the request at once (the client gives up
    after 20 s: a runtime that waited to fill the batch would fail it)."""
    server = make_server(
        "bt_batch", "--max-batch-size", "32", "--max-batch-wait", "60", "--timeout", "120"
    )
    answer = ask(server, "alone", timeout=20)
    assert answer.status == 200 and answer.json()["batch"] == ["alone"]


@pytest.mark.parametrize("style", ["def", "async"])
def test_a_batch_of_one_answers_as_the_unbatched_handler(make_server: ServerFactory, style: str):
    batched = make_server("bt_batch", "--handler", BATCHED[style], "--max-batch-size", "4")
    plain = make_server("bt_batch", "--handler", "main:one")
    one, other = ask(batched, "same"), ask(plain, "same")
    assert (one.status, one.body) == (other.status, other.body)
    for name in ("Content-Type", "Content-Length", "x-id"):
        assert one.headers[name] == other.headers[name]


def test_a_full_batch_goes_to_a_free_slot_without_waiting(
    make_server: ServerFactory, tmp_path: Path
):
    """Two slots, one busy: four requests fill a batch of four, which goes to the free slot
    at once, though ``--max-batch-wait`` is a minute (they are answered while the holder
    still holds its slot)."""
    server = two_slots(make_server, 4, 60)
    asked = Asked(server)
    release = busy(server, tmp_path, asked)
    for index in range(4):
        asked.send(f"f{index}")
    wait_until(lambda: all(f"f{i}" in asked.answers for i in range(4)), 30, "the full batch")
    assert "holder" not in asked.answers
    assert sorted(batch_with(server, "f0")) == [f"f{index}" for index in range(4)]
    assert total(scrape(server), "abeja_runtime_batches_total", reason="full") == 1
    release.touch()
    assert asked.wait()["holder"].status == 200


def test_a_batch_goes_once_its_first_request_has_waited(make_server: ServerFactory, tmp_path: Path):
    """Two slots, one busy, a batch far from full: it goes to the free slot once its first
    request has waited ``--max-batch-wait`` (answered while the holder still holds)."""
    server = two_slots(make_server, 32, 0.5)
    asked = Asked(server)
    release = busy(server, tmp_path, asked)
    asked.send("w0")
    wait_until(lambda: "w0" in asked.answers, 30, "the waited batch")
    assert "holder" not in asked.answers
    assert asked.answers["w0"].json()["batch"] == ["w0"]
    assert total(scrape(server), "abeja_runtime_batches_total", reason="waited") == 1
    release.touch()
    asked.wait()


def test_the_wait_runs_from_the_first_arrival_and_is_not_stretched_by_later_ones(
    make_server: ServerFactory, tmp_path: Path
):
    """Twelve requests a quarter of a second apart, with ``--max-batch-wait 1``: a wait that
    each arrival stretched would gather all twelve into one batch; from the first arrival,
    no batch holds what arrived over much more than a second."""
    server = two_slots(make_server, 32, 1)
    asked = Asked(server)
    release = busy(server, tmp_path, asked)
    for index in range(12):
        asked.send(f"p{index}")
        time.sleep(0.25)  # the load's shape, not a synchronisation: nothing waits on it
    wait_until(lambda: sum(f"p{i}" in asked.answers for i in range(12)) == 12, 30, "all twelve")
    for index in range(12):
        batch_with(server, f"p{index}")
    sizes = [len(batch) for batch in batches(server) if batch[0].startswith("p")]
    assert sum(sizes) == 12 and len(sizes) >= 2, sizes
    release.touch()
    asked.wait()


def test_a_request_past_its_deadline_gets_504_alone_and_stays_out_of_the_next_batch(
    make_server: ServerFactory, tmp_path: Path
):
    server = make_server(
        "bt_batch", "--max-batch-size", "8", "--max-batch-wait", "0.01", "--timeout", "2"
    )
    asked = Asked(server)
    release = tmp_path / "release"
    asked.send("holder", f"&hold={release}")
    wait_until(lambda: ["holder"] in batches(server), 20, "the holder's call")
    late = ask(server, "late")  # waits in the queue past its deadline
    assert late.status == 504
    asked.send("next")  # queued: the holder's call still runs (its client had its 504 too)
    wait_until(queued(server, 1), 20, "the next request queued")
    release.touch()
    answers = asked.wait()
    assert answers["next"].status == 200 and answers["next"].json()["batch"] == ["next"]
    assert batch_with(server, "next") == ["next"]
    assert not any("late" in batch for batch in batches(server))


def test_a_client_that_leaves_drops_out_and_its_neighbours_are_answered(
    make_server: ServerFactory, tmp_path: Path
):
    server = make_server("bt_batch", "--max-batch-size", "8")
    asked = Asked(server)
    release = busy(server, tmp_path, asked)
    gone = send_and_leave(server, get("/?id=gone", "gone"))
    asked.send("stays")
    wait_until(queued(server, 3), 20, "both queued")
    gone.shutdown(socket.SHUT_RDWR)
    gone.close()
    wait_until(lambda: records_of(server, "gone"), 20, "the leaver's record")
    release.touch()
    answers = asked.wait()
    assert answers["stays"].json()["batch"] == ["stays"]
    assert batch_with(server, "stays") == ["stays"]
    assert not any("gone" in batch for batch in batches(server))
    (record,) = records_of(server, "gone")
    assert record["http_status"] == 499


def test_an_item_answered_with_an_exception_fails_alone(make_server: ServerFactory, tmp_path: Path):
    server = make_server("bt_batch", "--max-batch-size", "8")
    asked = Asked(server)
    release = busy(server, tmp_path, asked)
    asked.send("bad", "&fail=item")
    asked.send("good")
    wait_until(queued(server, 3), 20, "both queued")
    release.touch()
    answers = asked.wait()
    assert sorted(batch_with(server, "bad")) == ["bad", "good"]
    assert answers["bad"].status == 500 and answers["good"].status == 200
    # The worker logged it before it answered; the test's reader thread may come to it later.
    server.wait_for_record(lambda r: "item bad failed" in str(r.get("traceback", "")))


@pytest.mark.parametrize(
    "fail, said",
    [
        ("batch", "unexpected error occurred in the handler main:handler"),
        ("length", "returned 1 results for a batch of 2 requests"),
    ],
)
def test_a_handler_that_raises_or_miscounts_fails_its_whole_batch(
    make_server: ServerFactory, tmp_path: Path, fail: str, said: str
):
    server = make_server("bt_batch", "--max-batch-size", "8")
    asked = Asked(server)
    release = busy(server, tmp_path, asked)
    asked.send("one", f"&fail={fail}")
    asked.send("two")
    wait_until(queued(server, 3), 20, "both queued")
    release.touch()
    answers = asked.wait()
    assert sorted(batch_with(server, "one")) == ["one", "two"]
    assert answers["one"].status == answers["two"].status == 500
    assert server.wait_for_record(lambda r: said in r.get("message", ""))
    assert ask(server, "after").status == 200  # the worker serves on


def test_batching_is_refused_for_a_style_that_takes_one_request_a_call(
    make_server: ServerFactory,
):
    with pytest.raises(AssertionError, match="leave --max-batch-size at 1"):
        make_server("st_seldon_identity", "--handler", "MyModel", "--max-batch-size", "4")


@pytest.mark.parametrize("declared", [False, True], ids=["setting", "declared"])
def test_a_batch_run_calls_a_batched_handler_with_batches_of_one(tmp_path: Path, declared: bool):
    env = {"INPUT": '{"x": 1}', "HANDLER": "main:declared" if declared else "main:handler"}
    if not declared:
        env["ABEJA_RUNTIME_MAX_BATCH_SIZE"] = "4"
    done = subprocess.run(
        runtime_command("batch"),
        cwd=HANDLERS / "bt_batch",
        env=runtime_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["batch"] == [""]


# -- the README's example ---------------------------------------------------------------------

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_example(tmp_path: Path) -> tuple[Path, list[str], list[str]]:
    """The README's batching example: a folder with its ``main.py``, the command its first
    line gives, and its curl command line."""
    pytest.importorskip("numpy")
    section = README.read_text("utf-8").split("### Batching requests", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    curl = section.split("```sh\n", 1)[1].split("```", 1)[0]
    folder = tmp_path / "readme"
    folder.mkdir()
    (folder / "main.py").write_text(code)
    command = code.splitlines()[0].removeprefix("# main.py:")
    return folder, shlex.split(command), shlex.split(curl)


def test_the_readme_example_answers_as_written(make_server: ServerFactory, tmp_path: Path):
    """Its command serves the handler batched, and its curl line, sent to the port that the
    command serves on, gets the model's answer."""
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    folder, command, curl = readme_example(tmp_path)
    assert command[0] == "abeja-runtime" and "--port" not in command, command
    (url,) = [arg for arg in curl if arg.startswith("localhost:")]
    assert urllib.parse.urlsplit(f"http://{url}").port == Config.port, curl
    server = make_server(folder, *command[1:])  # on a free port, which the curl line is given
    sent = [f"localhost:{server.port}" if arg == url else arg for arg in curl]
    done = subprocess.run(sent, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    (y,) = json.loads(done.stdout).values()
    assert len(y) == 3, done.stdout


def test_a_handler_written_for_batches_but_served_unbatched_is_told_so(
    make_server: ServerFactory, tmp_path: Path
):
    """Served one request a call, the README's handler goes over that request's keys and
    fails on the first (``'str' object has no attribute 'read'``); the error in the log says
    that it is not served batched, and how to serve it so."""
    folder, _, _ = readme_example(tmp_path)
    server = make_server(folder, "--handler", "main:handler")
    answer = server.post_json({"x": [1, 2, 3, 4]})
    assert (answer.status, answer.json()) == (500, {"status": "unexpected error occurred"})
    record = server.wait_for_record(
        lambda r: r.get("message", "").startswith("unexpected error occurred in the handler")
    )
    assert record["message"] == (
        "unexpected error occurred in the handler main:handler; the handler went over the keys "
        "of its request, as a handler written for batches goes over its list of requests, but "
        "it is served one request a call, not batched (--max-batch-size is 1 and it is not "
        "declared @abeja_runtime.batched): if it takes a list of requests, serve it with "
        "--max-batch-size N above 1 (ABEJA_RUNTIME_MAX_BATCH_SIZE) or declare it with "
        "@abeja_runtime.batched()"
    )
    assert "'str' object has no attribute 'read'" in json.dumps(record)
