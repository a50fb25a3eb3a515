"""What worker crashes cost other clients: steady load, and a crashing request every second.

``connections`` keep-alive clients send GET requests to a 5 ms handler on a runtime with
``--workers 2``; meanwhile, once a second, another client sends a request whose handler calls
``os._exit`` (its worker dies and is replaced). Every load request that does not get a 200 is a
failure caused by a crash. Prints requests, failures and failures per crash; nothing is
asserted. Sends traffic to 127.0.0.1 only; bounded by ``--seconds``.

    python -m benchmarks.chaos                        # the working tree
    python -m benchmarks.chaos --runtime-ref 235dafd  # a commit, through git archive
"""

from __future__ import annotations

import argparse
import http.client
import os
import tempfile
import threading
import time
from pathlib import Path

from abeja_runtime.launch import RuntimeProcess, free_ports, runtime_command
from benchmarks.servers import runtime_source

HANDLER_DIR = Path(__file__).resolve().parent / "handlers" / "chaos"


def load(port: int, stop: threading.Event, counts: dict[str, int], lock: threading.Lock) -> None:
    connection: http.client.HTTPConnection | None = None
    while not stop.is_set():
        if connection is None:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            connection.request("GET", "/")
            answer = connection.getresponse()
            answer.read()
            key = "ok" if answer.status == 200 else f"status {answer.status}"
        except (OSError, http.client.HTTPException) as exc:
            key = type(exc).__name__
            connection.close()
            connection = None
        with lock:
            counts[key] = counts.get(key, 0) + 1
    if connection is not None:
        connection.close()


def crash(port: int) -> None:
    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        connection.request("GET", "/?exit=1")
        connection.getresponse().read()
    except (OSError, http.client.HTTPException):
        pass


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.chaos", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--runtime-ref", default="", help="git commit to run (default: tree)")
    parser.add_argument("--connections", type=int, default=20)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="abeja-chaos-") as tmp:
        source, _ = runtime_source(args.runtime_ref, Path(tmp))
        port, health = free_ports(2)
        env = {**os.environ, "PYTHONPATH": str(source), "LOG_LEVEL": "error"}
        env["ABEJA_RUNTIME_DRAIN_DELAY"] = "0"  # no balancer in front to wait for at its stop
        flags = ["--host", "127.0.0.1", "--port", str(port), "--healthcheck-port", str(health)]
        server = RuntimeProcess(
            runtime_command(*flags, "--workers", str(args.workers)),
            cwd=HANDLER_DIR,
            env=env,
            on_line=lambda line: None,
        )
        server.port, server.healthcheck_port = port, health
        try:
            server.wait_healthy(30)
            stop = threading.Event()
            counts: dict[str, int] = {}
            lock = threading.Lock()
            clients = [
                threading.Thread(target=load, args=(port, stop, counts, lock))
                for _ in range(args.connections)
            ]
            for client in clients:
                client.start()
            crashes = 0
            began = time.monotonic()
            while time.monotonic() - began < args.seconds:
                time.sleep(1.0)  # the fault rate of the scenario, not a synchronisation
                crash(port)
                crashes += 1
            stop.set()
            for client in clients:
                client.join(30)
        finally:
            server.stop(30)
    failures = sum(n for key, n in counts.items() if key != "ok")
    label = args.runtime_ref or "working tree"
    print(
        f"{label}: {counts.get('ok', 0)} answered, {failures} failed "
        f"({failures / crashes:.1f} per crash, {crashes} crashes); {dict(sorted(counts.items()))}"
    )


if __name__ == "__main__":
    main()
