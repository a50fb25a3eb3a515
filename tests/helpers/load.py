"""A bounded load client for tests that put a server under steady load while something fails.

Used by the fault-injection tests (a runtime on loopback) and the replica tests (haproxy in front
of containers). Every loop is bounded by ``max_seconds``.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
import time
from dataclasses import dataclass, field

__all__ = ["LoadClient", "Tally"]


@dataclass
class Tally:
    answered: int = 0
    failures: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)

    def p99(self) -> float:
        ordered = sorted(self.latencies)
        return ordered[int(len(ordered) * 0.99)] if ordered else 0.0


class LoadClient:
    """``connections`` keep-alive clients POSTing to ``port`` until :meth:`stop`, bounded.

    Each request is a small JSON body that the handler echoes under ``"echo"`` (the ``replica``
    and ``fi_faults`` handlers); anything but a 200 with that echo is a failure, kept with its
    reason. ``tally()`` starts a fresh count (a phase).
    """

    def __init__(
        self,
        port: int,
        connections: int = 6,
        max_seconds: float = 300.0,
        path: str = "/?ms=5",
    ) -> None:
        self._port = port
        self._path = path
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._tally = Tally()
        self._deadline = time.monotonic() + max_seconds
        self._threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(connections)
        ]
        for thread in self._threads:
            thread.start()

    def tally(self) -> Tally:
        """The counts since the previous call, and a fresh count from now."""
        with self._lock:
            done, self._tally = self._tally, Tally()
        return done

    def peek(self) -> Tally:
        """The counts so far in this phase (a copy; the count goes on)."""
        with self._lock:
            return Tally(
                self._tally.answered, list(self._tally.failures), list(self._tally.latencies)
            )

    def stop(self) -> Tally:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)
        return self.tally()

    def _run(self, index: int) -> None:
        connection: http.client.HTTPConnection | None = None
        sent = 0
        while not self._stop.is_set() and time.monotonic() < self._deadline:
            if connection is None:
                connection = http.client.HTTPConnection("127.0.0.1", self._port, timeout=30)
            body = json.dumps({"client": index, "n": sent}).encode()
            began = time.monotonic()
            try:
                connection.request("POST", "/?ms=5", body, {"Content-Type": "application/json"})
                answer = connection.getresponse()
                data = answer.read()
                ok = answer.status == 200 and json.loads(data)["echo"] == json.loads(body)
                reason = "" if ok else f"{answer.status} {data[:200]!r}"
                if answer.getheader("Connection", "").lower() == "close":
                    connection.close()
                    connection = None
            except (OSError, http.client.HTTPException, ValueError) as exc:
                reason = f"{type(exc).__name__}: {exc}"
                with contextlib.suppress(OSError):
                    connection.close()
                connection = None
            elapsed = time.monotonic() - began
            with self._lock:
                if reason:
                    self._tally.failures.append(reason)
                else:
                    self._tally.answered += 1
                    self._tally.latencies.append(elapsed)
            sent += 1
        if connection is not None:
            connection.close()
