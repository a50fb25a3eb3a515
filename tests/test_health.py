"""``/health_check`` on both ports (issue point 4; contract A2, A4, A6 / Part B 1.3, 1.7)."""

from __future__ import annotations

import http.client
import json
import signal
import threading
from pathlib import Path

import pytest
from helpers.servers import RunningServer
from helpers.waiting import wait_until

OK = {"status": "ok"}
UNAVAILABLE = {"status": "service unavailable"}


def health(port: int, path: str = "/health_check", timeout: float = 30.0):
    """(status, content type, parsed JSON body) of one GET on a fresh connection; the timeout
    only keeps a hang from hanging the test."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("GET", path)
        answer = connection.getresponse()
        return answer.status, answer.getheader("Content-Type"), json.loads(answer.read())
    finally:
        connection.close()


def status_or_zero(port: int) -> int:
    try:
        return health(port, timeout=10.0)[0]
    except (OSError, ValueError):
        return 0


class BlockedCall:
    """A call of ``hl_blocking`` running in a thread until :meth:`release`."""

    def __init__(self, server: RunningServer, tmp_path: Path) -> None:
        self.started = tmp_path / "started"
        self.release_file = tmp_path / "release"
        self.answer = None
        paths = {"started": str(self.started), "release": str(self.release_file)}
        self._thread = threading.Thread(target=self._call, args=(server, paths), daemon=True)
        self._thread.start()
        wait_until(self.started.exists, 10, "the handler call to start")

    def _call(self, server: RunningServer, paths: dict[str, str]) -> None:
        self.answer = server.post_json(paths, timeout=30)

    def running(self) -> bool:
        """Whether the call still waits for its answer (the handler returns only once released,
        or after 20 s by itself)."""
        return self._thread.is_alive()

    def release(self):
        self.release_file.touch()
        self._thread.join(15)
        assert not self._thread.is_alive(), "the released call did not return"
        return self.answer


def test_both_ports_answer_ok_when_ready(make_server):
    server = make_server("ld_sync")
    for port in (server.port, server.healthcheck_port):
        assert health(port) == (200, "application/json", OK)


def test_503_while_the_module_imports_then_200(make_server, tmp_path):
    imported = tmp_path / "import-may-end"
    server = make_server("hl_slow_import", wait=False, env={"HL_IMPORT_UNTIL": str(imported)})
    # The import cannot end before the test creates the file: these are answered while it runs.
    assert health(server.healthcheck_port) == (503, "application/json", UNAVAILABLE)
    assert health(server.port) == (503, "application/json", UNAVAILABLE)
    service = server.request("POST", "/", b"{}", {"Content-Type": "application/json"})
    assert (service.status, service.json()) == (503, UNAVAILABLE)

    imported.touch()
    seen: list[int] = []

    def healthy() -> bool:
        seen.append(status_or_zero(server.healthcheck_port))
        return seen[-1] == 200

    wait_until(healthy, 20, "/health_check to answer 200 after the import")
    assert set(seen[:-1]) <= {503}, seen
    for port in (server.port, server.healthcheck_port):
        assert health(port) == (200, "application/json", OK)
    assert server.request("GET", "/").json() == {"imported": True}


@pytest.mark.parametrize(
    "handler", ["main:handler", "main:async_handler"], ids=["sync", "async-blocking-its-loop"]
)
def test_health_answers_at_once_while_a_handler_runs(make_server, tmp_path, handler):
    """Answered by the front, whatever the handler does: a ``def`` handler busy, or an
    ``async def`` one that blocks its worker's event loop (the README's "Workers and faults")."""
    server = make_server("hl_blocking", "--handler", handler)
    call = BlockedCall(server, tmp_path)
    for port in (server.healthcheck_port, server.port):
        assert health(port) == (200, "application/json", OK)
        # Checked after the answer: the call was running all along (had health waited for it,
        # the call would have ended, by itself, after 20 s).
        assert call.running(), "the health check waited for the handler call to end"
    answer = call.release()
    assert (answer.status, answer.json()) == (200, {"released": True})


def test_health_says_503_during_shutdown_until_exit(make_server, tmp_path):
    server = make_server("hl_blocking")
    call = BlockedCall(server, tmp_path)
    server.process.send_signal(signal.SIGTERM)
    wait_until(lambda: status_or_zero(server.healthcheck_port) == 503, 10, "health to say 503")
    for _ in range(5):
        assert health(server.healthcheck_port) == (503, "application/json", UNAVAILABLE)
    assert server.process.poll() is None, "the runtime exited before its request finished"

    answer = call.release()
    assert (answer.status, answer.json()) == (200, {"released": True})
    seen: list[int] = []

    def exited() -> bool:
        seen.append(status_or_zero(server.healthcheck_port))
        return server.process.poll() is not None

    wait_until(exited, 15, "the runtime to exit")
    assert set(seen) <= {503, 0}, seen
    assert server.process.wait(5) == 0


def test_health_port_answers_404_json_for_other_paths(make_server):
    server = make_server("ld_sync")
    for path in ("/", "/predict", "/health_check/", "/health", "/health_check?x=1/.."):
        status, content_type, body = health(server.healthcheck_port, path)
        expected = 200 if path.startswith("/health_check?") else 404
        assert (status, content_type) == (expected, "application/json"), path
        assert isinstance(body.get("status"), str) and body["status"], path
