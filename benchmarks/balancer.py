"""A real haproxy in front of runtime replicas: the replica and drain tests, benchmarks.drain.

haproxy (Debian's package) runs on the host with one server slot per host port pair; slots with
nothing behind them are simply DOWN, as an empty endpoint would be. It health-checks each slot's
``/health_check`` on the health port. Tuned (the replica tests), it checks every 200 ms and
retries a request on another server when a connection is refused or a server closes it without
an answer, as a Kubernetes ingress or cloud load balancer in front of several pods would be
configured to; otherwise it keeps haproxy's own defaults, what a deployment that only turns
readiness checks on has (the drain tests).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from abeja_runtime.launch import free_port, free_ports

__all__ = ["HAPROXY", "Balancer", "Slot"]

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"


@dataclass
class Slot:
    """Host ports where one replica publishes its service and health ports (new ones through
    :meth:`Balancer.repoint`, when another process took them meanwhile)."""

    name: str
    port: int = field(default_factory=free_port)
    health_port: int = field(default_factory=free_port)


#: How many times (every 50 ms) :meth:`Balancer.repoint` looks for haproxy's stats socket.
_SOCKET_POLLS: Final = 200
#: Retries on another server, for what a refused or dropped connection may cost.
_TUNED_RETRIES: Final = """    retries 3
    option redispatch 1
    option http-buffer-request
    retry-on conn-failure empty-response response-timeout
"""
#: Checks every 200 ms, DOWN at the first failure, UP at the first success.
_TUNED_CHECKS: Final = """    http-check expect status 200
    default-server inter 200ms fall 1 rise 1
"""


class Balancer:
    """haproxy with ``slots`` servers; ``up()`` reads which are UP from its stats socket.

    ``tuned=False``: only what readiness needs (``option httpchk`` and a ``check port`` per
    server) and timeouts; haproxy's defaults do the rest: a check every 2 s, DOWN after 3
    failures and UP after 2 successes, a request retried 3 times on the same server only when
    its connection is refused.
    """

    def __init__(self, directory: Path, slots: list[Slot], *, tuned: bool = True) -> None:
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
{_TUNED_RETRIES if tuned else ""}
frontend front
    bind 127.0.0.1:{self.port}
    default_backend replicas

backend replicas
    balance roundrobin
    option httpchk GET /health_check
{_TUNED_CHECKS if tuned else ""}{servers}
"""
        )
        self.process = subprocess.Popen(
            [HAPROXY, "-f", str(config), "-db"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def repoint(self, slot: Slot) -> None:
        """New ports for ``slot``, and haproxy sends its requests and checks there from now on.

        A port picked free is only free until someone binds it: a container of another test
        may have been published on it meanwhile (Docker: "port is already allocated")."""
        slot.port, slot.health_port = free_ports(2)
        for _ in range(_SOCKET_POLLS):  # haproxy opens its stats socket a moment after it starts
            if self.up() or self._socket.exists():
                break
            time.sleep(0.05)
        for command in (
            f"set server replicas/{slot.name} addr 127.0.0.1 port {slot.port}",
            f"set server replicas/{slot.name} check-port {slot.health_port}",
        ):
            self._command(command)

    def up(self) -> set[str]:
        """Names of the servers haproxy considers UP now (none while it starts)."""
        try:
            data = self._command("show stat")
        except (FileNotFoundError, ConnectionRefusedError):
            if self.process.poll() is None:
                return set()  # its stats socket is not open yet
            assert self.process.stderr is not None
            error = self.process.stderr.read().decode(errors="replace")
            raise AssertionError(f"haproxy exited: {error}") from None
        rows = [line.split(",") for line in data.decode().splitlines() if line and line[0] != "#"]
        return {
            row[1]
            for row in rows
            if row[0] == "replicas" and row[1] != "BACKEND" and row[17].startswith("UP")
        }

    def _command(self, command: str) -> bytes:
        """What haproxy answers ``command`` on its stats socket."""
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(str(self._socket))
            sock.sendall(command.encode() + b"\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        return data

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
