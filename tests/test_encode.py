"""encode.py on its own: the contract checks on the handler's dict, raised as HandlerResultError."""

from __future__ import annotations

import asyncio
import importlib.util
import sys

import pytest
from helpers.servers import HANDLERS

from abeja_runtime.encode import encode_result
from abeja_runtime.errors import HandlerResultError

sys.path.insert(0, str(HANDLERS / "rs_table"))
_spec = importlib.util.spec_from_file_location("rs_table_main", HANDLERS / "rs_table" / "main.py")
assert _spec is not None and _spec.loader is not None
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
BAD_RESULTS = _module.BAD_RESULTS


def _body(response) -> bytes:
    body = response.body
    return body if isinstance(body, bytes) else b"".join(body)


@pytest.mark.parametrize("name", sorted(set(BAD_RESULTS) - {"raises"}))
def test_contract_violations_raise_with_a_message_for_the_author(name):
    with pytest.raises(HandlerResultError) as caught:
        _body(encode_result(BAD_RESULTS[name]()))
    assert len(str(caught.value)) > 20


def test_extra_headers_win_over_metadata_and_metadata_numbers_become_text():
    response = encode_result(
        {"metadata": {"X-A": 1.5, "x-abeja-sys-meta-runtime-version": "fake"}},
        extra_headers=[("x-abeja-sys-meta-runtime-version", "real")],
    )
    assert dict(response.headers) == {
        "Content-Type": "text/plain",
        "X-A": "1.5",
        "x-abeja-sys-meta-runtime-version": "real",
    }


def test_generators_are_streamed_lazily_and_closed():
    closed = []

    def produce():
        try:
            yield "a"
            yield "b"
        finally:
            closed.append(True)

    response = encode_result({"content": produce()})
    chunks = response.body
    assert not isinstance(chunks, bytes)
    assert next(chunks) == b"a\n"
    chunks.close()
    assert closed == [True]


def test_streamed_lines_end_with_their_newline_and_in_memory_ones_are_separated():
    """A generator's JSON and text items each end with a newline (issue 37 point 10: a line
    reader has each as it is sent); a list is written as ABEJA Platform wrote it, lines
    separated, the last without one; bytes are raw in both."""

    def produce():
        yield {"item": 0}
        yield "text"
        yield b"raw"
        yield [("a", 1)]

    async def produce_async():
        for element in produce():
            yield element

    async def gathered(chunks) -> list[bytes]:
        return [chunk async for chunk in chunks]

    expected = [b'{"item": 0}\n', b"text\n", b"raw", b'{"a": 1}\n']
    assert list(encode_result({"content": produce()}).body) == expected
    assert asyncio.run(gathered(encode_result({"content": produce_async()}).body)) == expected
    in_memory = encode_result({"content": list(produce())}).body
    assert in_memory == b'{"item": 0}\ntextraw\n{"a": 1}'


def test_http_status_enum_and_none_status():
    import http

    assert encode_result({"status_code": http.HTTPStatus.CREATED}).status == 201
    assert encode_result({"status_code": None}).status == 200


def test_an_event_stream_frames_each_element_as_a_server_sent_event():
    def events():
        yield {"token": "Hello"}
        yield [1, 2]
        yield "event: done\ndata: [DONE]\n\n"  # a string is written as the handler wrote it

    reply = encode_result({"content_type": "text/event-stream", "content": events()})
    assert b"".join(reply.body) == (
        b'data: {"token": "Hello"}\n\ndata: [1, 2]\n\nevent: done\ndata: [DONE]\n\n'
    )
    assert ("Cache-Control", "no-cache") in reply.headers
    assert ("X-Accel-Buffering", "no") in reply.headers


def test_an_event_stream_keeps_the_handler_s_own_cache_control():
    reply = encode_result(
        {
            "content_type": "text/event-stream",
            "content": iter([{"a": 1}]),
            "metadata": {"Cache-Control": "no-store"},
        }
    )
    cache = [value for name, value in reply.headers if name.lower() == "cache-control"]
    assert cache == ["no-store"]
