"""A real haproxy in front of runtime containers, and a bounded load client, for the replica tests.

haproxy (Debian's package) runs on the host with one server slot per host port pair; slots with
nothing behind them are simply DOWN, as an empty endpoint would be. It health-checks each slot's
``/health_check`` on the health port, and retries a request on another server when a connection
is refused or a server closes it without an answer, as a Kubernetes ingress or cloud load
balancer in front of several pods would be configured to.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["HAPROXY", "Balancer", "LoadClient", "Slot", "free_port"]

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class Slot:
    """Host ports where one replica publishes its service and health ports."""

    name: str
    port: int = field(default_factory=free_port)
    health_port: int = field(default_factory=free_port)


class Balancer:
    """haproxy with ``slots`` servers; ``up()`` reads which are UP from its stats socket."""

    def __init__(self, directory: Path, slots: list[Slot]) -> None:
        self.port = free_port()
        self._socket = directory / "haproxy.sock"
        servers = "\n".join(
            f"    server {s.name} 127.0.0.1:{s.port} check port {s.health_port}" for s in slots
        )
        config = directory / "haproxy.cfg"
        config.write_text(
            f"""global
    stats socket {self._socket} mode 600 level admin
    maxconn 2000

defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    timeout check 1s
    retries 3
    option redispatch 1
    option http-buffer-request
    retry-on conn-failure empty-response response-timeout

frontend front
    bind 127.0.0.1:{self.port}
    default_backend replicas

backend replicas
    balance roundrobin
    option httpchk GET /health_check
    http-check expect status 200
    default-server inter 200ms fall 1 rise 1
{servers}
"""
        )
        self.process = subprocess.Popen(
            [HAPROXY, "-f", str(config), "-db"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def up(self) -> set[str]:
        """Names of the servers haproxy considers UP now."""
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(str(self._socket))
            sock.sendall(b"show stat\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        rows = [line.split(",") for line in data.decode().splitlines() if line and line[0] != "#"]
        return {
            row[1]
            for row in rows
            if row[0] == "replicas" and row[1] != "BACKEND" and row[17].startswith("UP")
        }

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        if self.process.stderr is not None:
            self.process.stderr.close()


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

    Each request is a small JSON body that the replica echoes; anything but a 200 with that echo
    is a failure, kept with its reason. ``tally()`` starts a fresh count (a phase).
    """

    def __init__(self, port: int, connections: int = 6, max_seconds: float = 300.0) -> None:
        self._port = port
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
