"""ABEJA Platform v1 (18.10) generator handlers, served by the ``abeja-v1`` style adapter.

The handlers are ABEJA's public v1 samples (``for img in _iter: ... yield {"result": ...}``)
with their ML framework replaced by numpy; a real runtime serves them over HTTP.
"""

from __future__ import annotations

import io
import json
import uuid

import pytest
from PIL import Image


def picture(colour: tuple[int, ...], fmt: str = "JPEG", mode: str = "RGB") -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, (40, 30), colour).save(buffer, format=fmt)
    return buffer.getvalue()


def multipart(*parts: tuple[str, str, bytes]) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    body = b""
    for name, content_type, data in parts:
        body += (
            (
                f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n'
                f"Content-Type: {content_type}\r\n\r\n"
            ).encode()
            + data
            + b"\r\n"
        )
    return body + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def test_the_image_classifier_sample_gets_rgb_arrays_and_its_yield_is_the_answer(make_server):
    server = make_server("st_v1_classifier")
    record = server.wait_for_record(lambda r: r.get("style") == "abeja-v1")
    assert "generator" in record["message"], record

    bright = server.request("POST", "/", picture((250, 240, 230)), {"Content-Type": "image/jpeg"})
    assert bright.status == 200, bright.body
    assert bright.headers["Content-Type"] == "application/json"
    labels = [entry["label"] for entry in bright.json()["result"]]
    assert labels == ["cat", "dog"]

    dark = server.request("POST", "/", picture((5, 10, 5), "PNG"), {"Content-Type": "image/png"})
    assert [entry["label"] for entry in dark.json()["result"]] == ["dog", "cat"]


@pytest.mark.parametrize(
    ("body", "content_type", "expected"),
    [
        (
            picture((1, 2, 3, 4), "PNG", "RGBA"),
            "image/png",
            {"type": "ndarray", "shape": [30, 40, 3]},
        ),
        (picture((9,), "PNG", "L"), "image/png", {"type": "ndarray", "shape": [30, 40, 3]}),
        (b"a,b\n1,2\n", "text/csv", {"type": "bytes", "shape": None}),
        (b"\x00\x01", "application/octet-stream", {"type": "bytes", "shape": None}),
    ],
    ids=["rgba-png", "greyscale-png", "csv", "binary"],
)
def test_inputs_are_decoded_by_media_type(make_server, body, content_type, expected):
    server = make_server("st_v1_json", env={"CONTEXT": '{"model": "v1"}'})
    answer = server.request("POST", "/", body, {"Content-Type": content_type})
    assert answer.status == 200, answer.body
    assert answer.json() == {**expected, "context": {"model": "v1"}}


def test_json_input_arrives_as_python_objects_and_numpy_values_are_encoded(make_server):
    server = make_server("st_v1_json")
    answer = server.post_json({"user_id": 3})
    assert answer.status == 200, answer.body
    assert answer.json() == {
        "user_id": 3,
        "known_positives": ["Star Wars (1977)"],
        "recommended": ["Scream (1996)", "Fargo (1996)", "Contact (1997)"],
    }


def test_several_inputs_give_json_lines_in_order(make_server):
    server = make_server("st_v1_json")
    body, content_type = multipart(
        ("first", "application/json", b'{"user_id": 1}'),
        ("second", "application/json", b'{"user_id": 2}'),
        ("third", "image/jpeg", picture((0, 0, 0))),
    )
    answer = server.request("POST", "/", body, {"Content-Type": content_type})
    assert answer.status == 200, answer.body
    lines = [json.loads(line) for line in answer.body.decode().split("\n")]
    assert [line.get("user_id") for line in lines] == [1, 2, None]
    assert lines[2]["shape"] == [30, 40, 3]


@pytest.mark.parametrize(
    ("body", "content_type", "problem"),
    [
        (b'{"user_id": ', "application/json", "not valid JSON"),
        (b"[" * 2000 + b"]" * 2000, "application/json", "not valid JSON: it is nested too deeply"),
        (b"9" * 5000, "application/json", "not valid JSON: Exceeds the limit (4300 digits)"),
        (b"\xff\xd8 not really a jpeg", "image/jpeg", "not a readable image"),
    ],
    ids=["broken-json", "json-nested-too-deeply", "json-5000-digits", "broken-image"],
)
def test_undecodable_bodies_are_a_400_naming_the_problem(make_server, body, content_type, problem):
    server = make_server("st_v1_json")
    answer = server.request("POST", "/", body, {"Content-Type": content_type})
    assert answer.status == 400
    assert problem in answer.json()["status"]


def test_async_generator_handlers_work_too(make_server):
    server = make_server("st_v1_async")
    server.wait_for_record(lambda r: r.get("style") == "abeja-v1")
    answer = server.post_json({"a": 1})
    assert answer.status == 200, answer.body
    assert answer.json() == {"position": 0, "item": {"a": 1}}


def test_style_can_be_forced_for_a_v1_handler_that_returns_a_list(make_server, tmp_path):
    (tmp_path / "main.py").write_text(
        "def handler(_iter, ctx):\n    return [{'n': len(list(_iter))}, {'done': True}]\n"
    )
    server = make_server(tmp_path, "--style", "abeja-v1")
    answer = server.post_json({"a": 1})
    assert answer.body == b'{"n": 1}\n{"done": true}'
