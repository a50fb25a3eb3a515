"""decode.py on its own: errors are raised as HttpError subclasses, not written as responses."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from abeja_runtime.decode import BodyLimits, check_declared_length, decode_request
from abeja_runtime.errors import BadRequest, MethodNotAllowed, PayloadTooLarge

LIMITS = BodyLimits(max_body_size=1000, spool_threshold=10)


async def _chunks(*chunks: bytes) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


def _decode(method="POST", headers=(), chunks=(), limits=LIMITS, raw_query="", raw_path="/"):
    return asyncio.run(
        decode_request(
            method=method,
            raw_path=raw_path,
            raw_query=raw_query,
            headers=list(headers),
            body=_chunks(*chunks),
            limits=limits,
        )
    )


def test_body_split_across_chunks_is_joined_and_spooled():
    request = _decode(headers=[("Content-Type", "text/plain")], chunks=[b"hello ", b"world!"])
    try:
        assert request.read() == b"hello world!"
        assert hasattr(request["contents"][0]["body"], "name")  # 12 bytes > threshold 10
    finally:
        request.close()


def test_multipart_split_mid_boundary_is_parsed():
    body = b'--b\r\nContent-Disposition: form-data; name="a"\r\n\r\nvalue\r\n--b--\r\n'
    request = _decode(
        headers=[("Content-Type", "multipart/form-data; boundary=b")],
        chunks=[body[i : i + 3] for i in range(0, len(body), 3)],
    )
    try:
        (part,) = request["contents"]
        assert (part["form_name"], part.read()) == ("a", b"value")
    finally:
        request.close()


@pytest.mark.parametrize(
    ("chunks", "error"),
    [
        ([b"--b\r\nContent-Disposition: form-data; name=a\r\n\r\nunfinished"], BadRequest),
        ([b"no boundary here"], BadRequest),
    ],
)
def test_malformed_multipart_raises_bad_request(chunks, error):
    with pytest.raises(error, match="malformed multipart/form-data body"):
        _decode(headers=[("Content-Type", "multipart/form-data; boundary=b")], chunks=chunks)


def test_streamed_body_over_the_limit_raises_while_reading():
    with pytest.raises(PayloadTooLarge) as caught:
        _decode(chunks=[b"x" * 600, b"x" * 600])
    assert caught.value.message == "request body too large (limit 1000 bytes)"


def test_declared_length_is_checked_before_reading():
    with pytest.raises(PayloadTooLarge):
        check_declared_length(1001, LIMITS)
    check_declared_length(1000, LIMITS)
    check_declared_length(10**12, BodyLimits(max_body_size=0, spool_threshold=10))


def test_unknown_method_raises_with_allowed_methods():
    with pytest.raises(MethodNotAllowed) as caught:
        _decode(method="HEAD")
    assert caught.value.headers == {"Allow": "GET, POST, PUT, PATCH, DELETE"}


def test_invalid_utf8_in_the_path_is_bad_request():
    with pytest.raises(BadRequest, match="URL path"):
        _decode(method="GET", raw_path="/%ff")
