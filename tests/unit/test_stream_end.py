"""The end of a stream its handler process wrote to the client itself, as the pool hands it to
the call's responder (``PendingCall.end_stream`` / ``when_ended``): told once, whether it came
before the responder asked or after, and queued behind the chunks of a stream the front
relays."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from abeja_runtime.frames import Call
from abeja_runtime.front.pending import STREAM_FAILED, STREAM_LOST, PendingCall


@pytest.fixture
def ticket() -> Iterator[PendingCall]:
    loop = asyncio.new_event_loop()
    try:
        pending = PendingCall(Call(1, "POST", "/", "", (), "id-1", None, b"", "", 0), loop)
        pending.chunks = asyncio.Queue()
        yield pending
    finally:
        loop.close()


def test_an_end_that_comes_after_the_responder_asked_is_told_then_once(
    ticket: PendingCall,
) -> None:
    told: list[object] = []
    ticket.when_ended(told.append)
    assert told == []
    ticket.end_stream(None)
    ticket.end_stream(STREAM_LOST)  # (nothing after the end reaches the responder)
    assert told == [None]
    assert ticket.chunks is not None and ticket.chunks.qsize() == 1  # queued, not told twice


def test_an_end_that_came_before_the_responder_asked_is_told_at_once(ticket: PendingCall) -> None:
    told: list[object] = []
    ticket.end_stream(STREAM_FAILED)
    ticket.when_ended(told.append)
    assert told == [STREAM_FAILED]
    assert ticket.on_end is None


def test_a_relayed_stream_gets_its_end_after_its_chunks(ticket: PendingCall) -> None:
    assert ticket.chunks is not None
    ticket.chunks.put_nowait(b"piece")
    ticket.end_stream(None)
    assert [ticket.chunks.get_nowait(), ticket.chunks.get_nowait()] == [b"piece", None]
