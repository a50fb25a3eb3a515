"""Decompression bombs: an image whose header promises more pixels than ``--max-image-pixels``
is refused with 413 before it is decoded, in the runtime's own decoding (the v1 style) and in
handlers that open images with Pillow as written (the image_flip sample, and a handler that
imports Pillow only when called), over real HTTP."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import pytest
from PIL import Image

SAMPLES = Path(__file__).resolve().parents[1] / "samples"
TOO_MANY = {
    "status": "an image in the request has more than 89478485 pixels; the limit is "
    "ABEJA_RUNTIME_MAX_IMAGE_PIXELS (--max-image-pixels)"
}


def png(width: int, height: int) -> bytes:
    """A PNG whose header says ``width`` x ``height`` (1-bit grey), with almost no data: what
    a compressed bomb looks like to the check, which reads the header only."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data)
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\x00"))
        + chunk(b"IEND", b"")
    )


def small_png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (40, 30), (200, 100, 50)).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.mark.parametrize(
    "size", [(12000, 12000), (20000, 20000)], ids=["over-the-limit", "over-twice-the-limit"]
)
@pytest.mark.parametrize("where", ["image_flip sample", "v1 decoding"])
def test_an_image_bomb_is_refused_with_413(make_server, where: str, size: tuple[int, int]):
    if where == "image_flip sample":
        server = make_server(SAMPLES / "image_flip")
    else:
        server = make_server("st_v1_classifier")
    answer = server.request("POST", "/", png(*size), {"Content-Type": "image/png"})
    assert answer.status == 413, answer.body[:300]
    assert answer.json() == TOO_MANY
    assert server.request("POST", "/", small_png(), {"Content-Type": "image/png"}).status == 200


def test_the_limit_is_a_setting(make_server):
    server = make_server(SAMPLES / "image_flip", "--max-image-pixels", "1000")
    answer = server.request("POST", "/", small_png(), {"Content-Type": "image/png"})
    assert answer.status == 413
    assert "more than 1000 pixels" in answer.json()["status"]
    unlimited = make_server(SAMPLES / "image_flip", env={"ABEJA_RUNTIME_MAX_IMAGE_PIXELS": "0"})
    # No check at all: the header alone goes through (its data is then found short).
    assert (
        unlimited.request("POST", "/", png(12000, 12000), {"Content-Type": "image/png"}).json()[
            "status"
        ]
        != TOO_MANY["status"]
    )


def test_the_limit_holds_where_the_handler_imports_pillow_only_when_called(make_server):
    """Pillow is not loaded by the runtime for a handler that does not use it; when the handler
    imports it in a call, the limit is already set."""
    server = make_server("ib_lazy_pillow")
    fine = server.request("POST", "/", small_png(), {"Content-Type": "image/png"})
    assert fine.json() == {"size": [40, 30], "pillow_loaded_at_import": False}
    answer = server.request("POST", "/", png(12000, 12000), {"Content-Type": "image/png"})
    assert (answer.status, answer.json()) == (413, TOO_MANY)
