"""Graceful shutdown on SIGTERM/SIGINT (issue point 10; contract A6 / Part B 1.7)."""

from __future__ import annotations

import http.client
import json
import signal
import threading
from pathlib import Path

import pytest
from helpers.servers import RunningServer
from helpers.waiting import wait_until

UNAVAILABLE = {"status": "service unavailable"}


class HeldCall:
    """A call of ``sd_slow`` running in a thread until :meth:`release` (or, never released,
    for 60 s): the test, not the clock, decides when its work ends."""

    def __init__(self, server: RunningServer, tmp_path: Path) -> None:
        self.started = tmp_path / "started"
        self._release = tmp_path / "release"
        self.answer = None
        self.error: BaseException | None = None
        body = {"started": str(self.started), "release": str(self._release)}
        self._thread = threading.Thread(target=self._call, args=(server, body), daemon=True)
        self._thread.start()
        wait_until(self.started.exists, 10, "the slow handler call to start")

    def _call(self, server: RunningServer, body: dict) -> None:
        try:
            self.answer = server.post_json(body, timeout=30)
        except Exception as exc:  # the test inspects it
            self.error = exc

    def running(self) -> bool:
        return self._thread.is_alive()

    def release(self) -> None:
        self._release.touch()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"the call did not end within {timeout} s"


def new_request(port: int) -> int | str:
    """Status of a new request on a fresh connection, or the connection error's name."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("POST", "/", b'{"seconds": 0}', {"Content-Type": "application/json"})
        answer = connection.getresponse()
        body = answer.read()
        if answer.status == 503:
            assert json.loads(body) == UNAVAILABLE
        return answer.status
    except (ConnectionRefusedError, ConnectionResetError, http.client.RemoteDisconnected) as exc:
        return type(exc).__name__
    finally:
        connection.close()


def health_status(server: RunningServer) -> int:
    try:
        answer = server.request("GET", "/health_check", port=server.healthcheck_port, timeout=2)
        return answer.status
    except OSError:
        return 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_in_flight_request_completes_then_exit_0(make_server, tmp_path, sig):
    server = make_server("sd_slow")
    call = HeldCall(server, tmp_path)
    server.process.send_signal(sig)
    wait_until(lambda: health_status(server) == 503, 10, "the graceful shutdown to begin")
    assert call.running(), "the call ended before its work"
    assert server.process.poll() is None, "the runtime exited before its request finished"
    call.release()
    call.join(15)
    assert call.error is None, call.error
    assert (call.answer.status, call.answer.json()) == (200, {"released": True})
    assert server.process.wait(15) == 0


def test_new_connections_after_sigterm_are_refused_or_503(make_server, tmp_path):
    server = make_server("sd_slow")
    call = HeldCall(server, tmp_path)
    server.process.send_signal(signal.SIGTERM)
    # A request sent in the instant before the signal is handled is still accepted and served;
    # once health says 503, the service port must refuse or answer 503.
    wait_until(lambda: health_status(server) == 503, 10, "health to say 503")
    outcomes = [new_request(server.port) for _ in range(3)]
    assert server.process.poll() is None, "the runtime exited before its request finished"
    allowed = {503, "ConnectionRefusedError", "ConnectionResetError", "RemoteDisconnected"}
    assert set(outcomes) <= allowed, outcomes

    call.release()
    call.join(15)
    assert call.answer is not None and call.answer.status == 200, call.error
    assert server.process.wait(15) == 0


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_second_signal_exits_at_once(make_server, tmp_path, second):
    server = make_server("sd_slow")
    call = HeldCall(server, tmp_path)  # never released: it would outlast the 30 s grace period
    server.process.send_signal(signal.SIGTERM)
    wait_until(lambda: health_status(server) == 503, 10, "the graceful shutdown to begin")
    workers = children(server.process.pid)
    assert workers, "no worker processes"
    server.process.send_signal(second)
    # Exit code 1, the forced stop's (the graceful one, at the grace period's end, exits 0).
    assert server.process.wait(20) == 1
    stopped = server.wait_for_record(lambda r: "second signal" in r.get("message", ""))
    assert stopped["message"] == "second signal received; stopping at once"
    wait_until(lambda: all(gone(pid) for pid in workers), 10, "the workers to be gone")
    call.join(10)  # the client of the abandoned call is not left hanging
    assert call.answer is None or call.answer.status != 200


def children(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def gone(pid: int) -> bool:
    """The process has exited (a zombie counts: it runs nothing any more)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_the_start_ends_the_runtime_cleanly(make_server, sig):
    """Sent as the runtime logs its ports, while it starts its first handler process and
    imports its servers, a stop signal ends it with exit 0, no traceback and no process left
    (the log's end comes once every process that holds it is gone)."""
    server = make_server("sv_pid", wait=False)
    server.wait_for_record(lambda r: r.get("message", "").startswith("abeja-runtime "))
    assert server.stop(sig) == 0, server.lines
    assert not [line for line in server.lines if "Traceback" in line]
