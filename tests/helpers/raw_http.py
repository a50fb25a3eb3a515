"""Requests written on raw sockets, for clients that leave early, and what the runtime logged
of them (access-log records, events a handler printed).
"""

from __future__ import annotations

import json
import socket
from typing import Any

from helpers.servers import RunningServer


def send_and_leave(server: RunningServer, request: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sock.sendall(request)
    return sock


def get(path: str, request_id: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: x\r\nx-abeja-request-id: {request_id}\r\n\r\n".encode()


def chunked_post(path: str, request_id: str) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nx-abeja-request-id: {request_id}\r\n"
        "Transfer-Encoding: chunked\r\nContent-Type: text/plain\r\n\r\n2\r\nhi\r\n0\r\n\r\n"
    ).encode()


def records_of(server: RunningServer, request_id: str) -> list[dict[str, Any]]:
    return [
        r
        for r in server.records()
        if r.get("log_type") == "access_log" and r.get("request_id") == request_id
    ]


def printed(server: RunningServer) -> list[dict[str, Any]]:
    """What the handler printed as JSON objects (each a log record's message), in order."""
    found = []
    for record in server.records():
        try:
            value = json.loads(record.get("message", ""))
        except ValueError:
            continue
        if isinstance(value, dict):
            found.append(value)
    return found


def events(server: RunningServer, event: str, tag: str) -> list[dict[str, Any]]:
    return [p for p in printed(server) if p.get("event") == event and p.get("tag") == tag]


def read_until(sock: socket.socket, marker: bytes) -> bytes:
    """What arrives until ``marker`` has (bounded by the socket's timeout, and by its end)."""
    data = b""
    while marker not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def stream_once(server: RunningServer, path: str) -> bytes:
    """A streamed answer asked on a connection of its own and read to its chunked end (the
    socket then closed): a handler's first stream, after which the front lends its
    connections to an event-loop worker."""
    sock = send_and_leave(server, get(path, "first"))
    try:
        data = read_until(sock, b"0\r\n\r\n")
    finally:
        sock.close()
    assert data.endswith(b"0\r\n\r\n"), data[-200:]
    return data


def unread_by(server: RunningServer) -> int:
    """Bytes sent to the server's service port that it has not read yet, over all its
    connections (``/proc/net/tcp``): those in its sockets, and those still in its clients' (a
    full window holds them there): 0 once it has read all its clients sent."""
    unread = 0
    with open("/proc/net/tcp") as table:
        next(table)  # the column names
        for row in table:
            fields = row.split()
            local = int(fields[1].rpartition(":")[2], 16)
            remote = int(fields[2].rpartition(":")[2], 16)
            to_send, to_read = (int(queue, 16) for queue in fields[4].split(":"))
            listening = fields[3] == "0A"  # its queue is of connections, not bytes
            if local == server.port and not listening:
                unread += to_read
            elif remote == server.port:
                unread += to_send
    return unread
