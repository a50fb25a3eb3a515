"""The memory of big gRPC messages, read in ``/proc``: the front's bounded by its body places,
the handler processes' given back after each call.

grpcio reads a unary call's whole message before the method's coroutine runs, so twenty
concurrent 50 MiB Seldon ``Predict`` calls once took the front to a peak of 2.1 GB: each call's
message in grpcio's buffers and as bytes, while the body places bounded only what was
forwarded. Now a call takes a place before its message is read, and a connection's messages
are read one at a time (``front/rpc.py``); the others wait with their messages in their
clients, held back by HTTP/2 flow control.

A handler process reads a big message out of the front's buffer of shared memory. It kept
every buffer it had read mapped, the last 64 of them however big: after forty 50 MiB calls,
each of two processes held 1 GiB of shared memory with no call running, given back only at
exit. A buffer the front does not fill again is now unmapped after its call (``mapped.py``).

No bound here is a speed: the runtimes have no deadline (``--timeout 0``), and a client's
deadline and the test's own timeout are there to end a hang, far beyond any machine's time.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from helpers.grpc_calls import varint, with_grpc
from helpers.workers import wait_for_ready_workers

grpc = pytest.importorskip("grpc")

MIB = 1024 * 1024
SIZE = 50 * MIB
CALLS = 20
PREDICT = "/seldon.protos.Model/Predict"
#: Seconds a call may take before it is taken for hung (a client's deadline), and the test's
#: own timeout beyond them: a bound on hangs, not on the machine's speed (a call takes seconds;
#: twenty in a row, a few minutes on a loaded machine).
HUNG_AFTER = 1800
pytestmark = [
    pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc/<pid>/status"),
    pytest.mark.timeout(2 * HUNG_AFTER),
]


def status_bytes(pid: int, field: str) -> int:
    """A memory field of the process's ``/proc/<pid>/status`` (``VmHWM``: its peak resident
    memory so far; ``VmRSS``: its resident memory now; ``RssShmem``: the shared memory of it
    mapped), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for process {pid}")


def seldon_identity(make_server: Any, *flags: str) -> Any:
    """A runtime serving Seldon's identity model on gRPC, without a deadline, once its gRPC
    port is up."""
    server = with_grpc(
        make_server,
        "st_seldon_identity",
        "--style",
        "seldon",
        "--timeout",
        "0",
        *flags,
        env={"HANDLER": "MyModel"},
    )
    server.wait_for_record(lambda r: "serving gRPC" in r.get("message", ""))
    return server


def predict(port: int, index: int, answers: list[Any]) -> None:
    """One 50 MiB binData Predict on a channel of its own; its answer (or error) in
    ``answers[index]``, checked here so that only one message at a time is kept."""
    data = index.to_bytes(8, "big") * (SIZE // 8)
    message = b"\x22" + varint(len(data)) + data  # SeldonMessage.binData (field 4)
    options = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
            answer = channel.unary_unary(PREDICT)(message, timeout=HUNG_AFTER)
    except grpc.RpcError as exc:
        answers[index] = f"{exc.code()}: {exc.details()}"
        return
    right = answer.endswith(data) and b"\x22" + varint(len(data)) in answer
    answers[index] = "right" if right else f"wrong answer of {len(answer)} bytes"


def test_twenty_concurrent_50_mib_predicts_stay_within_the_body_places(make_server):
    """One process of concurrency 1 has 1 + 4 body places (``body.BODIES_AHEAD``): the
    other fifteen calls wait for one, unread. The twenty calls share one connection (grpcio's
    channels in a process share one per target), whose messages are read one at a time. The
    front's peak is its base, two copies of each message a place holds and three of the one
    being read (``front/rpc.py``): measured 0.42-0.56 GB; asserted under 80 MiB + 5 places x 2
    x 50 MiB + 3 x 50 MiB = 730 MiB. Before, the messages with a place were read at once:
    0.54-0.66 GB here, 1,010 MiB on another machine; before the places, 1.7-2.1 GB.

    Every call is answered, however long it waits: the runtime has no deadline (a default 60 s
    one was once hit by the last calls on a loaded machine, which fails nothing here)."""
    server = seldon_identity(make_server)
    front = server.process.pid
    started = status_bytes(front, "VmRSS")
    answers: list[Any] = [None] * CALLS
    callers = [
        threading.Thread(target=predict, args=(server.grpc_port, index, answers))
        for index in range(CALLS)
    ]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(HUNG_AFTER + 60)  # its client's deadline ends it before
    assert not any(caller.is_alive() for caller in callers), "a call outlived its deadline"
    assert answers == ["right"] * CALLS
    peak = status_bytes(front, "VmHWM")
    bound = 80 * MIB + 5 * 2 * SIZE + 3 * SIZE
    print(f"front: {started / MIB:.0f} MiB at the start, peak {peak / MIB:.0f} MiB")
    assert peak < bound, f"peak {peak / MIB:.0f} MiB, bound {bound / MIB:.0f} MiB"


def test_handler_processes_give_back_each_big_message_after_its_call(make_server):
    """Six 50 MiB calls, one after the other, over two processes: once they are answered, no
    process maps any of their messages. Measured: 0 MiB of shared memory in each; asserted
    under one message (50 MiB) for both. Before, each process kept every message it had read
    mapped, which kept the front's closed buffers in memory: 300 MiB in all."""
    server = seldon_identity(make_server, "--workers", "2")
    workers = wait_for_ready_workers(server, 2)
    answers: list[Any] = [None] * 6
    for index in range(len(answers)):
        predict(server.grpc_port, index, answers)
    assert answers == ["right"] * len(answers)
    shared = {pid: status_bytes(pid, "RssShmem") for pid in workers}
    front = status_bytes(server.process.pid, "RssShmem")
    print(f"shared memory mapped: workers {shared}, front {front} (bytes)")
    assert sum(shared.values()) < SIZE, f"the workers map {sum(shared.values()) / MIB:.0f} MiB"
    assert front < SIZE, f"the front maps {front / MIB:.0f} MiB"
