"""decode.py and limits.py on their own: errors are raised as HttpError subclasses, not
written as responses."""

from __future__ import annotations

import io

import pytest

from abeja_runtime.errors import BadRequest, MethodNotAllowed, PayloadTooLarge
from abeja_runtime.limits import BodyCounter, BodyLimits, check_declared_length, check_method
from abeja_runtime.worker import decode
from abeja_runtime.worker.decode import decode_request

LIMITS = BodyLimits(max_body_size=1000, spool_threshold=10)


def _decode(method="POST", headers=(), body=b"", limits=LIMITS, raw_query="", raw_path="/"):
    return decode_request(
        method=method,
        raw_path=raw_path,
        raw_query=raw_query,
        headers=list(headers),
        body=io.BytesIO(body),
        limits=limits,
    )


def test_a_plain_body_is_the_file_the_front_gave():
    request = _decode(headers=[("Content-Type", "text/plain")], body=b"hello world!")
    try:
        assert request.read() == b"hello world!"
        assert isinstance(request["contents"][0]["body"], io.BytesIO)
    finally:
        request.close()


def test_a_multipart_part_above_the_threshold_is_spooled():
    body = b'--b\r\nContent-Disposition: form-data; name="a"\r\n\r\nhello world!\r\n--b--\r\n'
    request = _decode(headers=[("Content-Type", "multipart/form-data; boundary=b")], body=body)
    try:
        (part,) = request["contents"]
        assert part.read() == b"hello world!"
        assert hasattr(part["body"], "name")  # 12 bytes > threshold 10
    finally:
        request.close()


def test_multipart_split_mid_boundary_is_parsed(monkeypatch):
    monkeypatch.setattr(decode, "_PARSE_CHUNK", 3)
    body = b'--b\r\nContent-Disposition: form-data; name="a"\r\n\r\nvalue\r\n--b--\r\n'
    request = _decode(headers=[("Content-Type", "multipart/form-data; boundary=b")], body=body)
    try:
        (part,) = request["contents"]
        assert (part["form_name"], part.read()) == ("a", b"value")
    finally:
        request.close()


@pytest.mark.parametrize(
    "body",
    [b"--b\r\nContent-Disposition: form-data; name=a\r\n\r\nunfinished", b"no boundary here"],
)
def test_malformed_multipart_raises_bad_request(body):
    with pytest.raises(BadRequest, match="malformed multipart/form-data body"):
        _decode(headers=[("Content-Type", "multipart/form-data; boundary=b")], body=body)


def test_a_body_over_the_limit_raises_while_it_is_counted():
    counter = BodyCounter(1000)
    counter.add(b"x" * 600)
    with pytest.raises(PayloadTooLarge) as caught:
        counter.add(b"x" * 600)
    assert caught.value.message == "request body too large (limit 1000 bytes)"


def test_declared_length_is_checked_before_reading():
    with pytest.raises(PayloadTooLarge):
        check_declared_length(1001, LIMITS)
    check_declared_length(1000, LIMITS)
    check_declared_length(10**12, BodyLimits(max_body_size=0, spool_threshold=10))


def test_unknown_method_raises_with_allowed_methods():
    with pytest.raises(MethodNotAllowed) as caught:
        check_method("HEAD")
    assert caught.value.headers == {"Allow": "GET, POST, PUT, PATCH, DELETE"}


def test_invalid_utf8_in_the_path_is_bad_request():
    with pytest.raises(BadRequest, match="URL path"):
        _decode(method="GET", raw_path="/%ff")
