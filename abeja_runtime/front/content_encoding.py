"""A request body's ``Content-Encoding``, undone by the front before the handler sees the body.

The front decodes rather than aiohttp (its parser runs with ``auto_decompress=False``) because
aiohttp's decoding let two kinds of bad body through the runtime's accounting: invalid gzip or
deflate data failed the request as an uncounted ``500`` with a traceback, and a gzip body cut
short reached the handler cut short. Here both are a counted ``400`` that says what was wrong,
and the decoded size is bounded as it grows (``max_length``), so that a small body which
inflates to gigabytes is refused (``413``) when it passes ``--max-body-size``, not after.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Final

from abeja_runtime.errors import BadRequest, HttpError

__all__ = ["BodyDecoder", "UnsupportedEncoding", "decoder_for"]

#: The most bytes one piece of decoded output holds: the limits are checked between pieces.
_PIECE: Final = 256 * 1024
#: zlib's window bits: gzip's wrapper, zlib's wrapper (HTTP's "deflate"), and no wrapper (what
#: some clients send as "deflate").
_GZIP: Final = 16 + zlib.MAX_WBITS
_ZLIB: Final = zlib.MAX_WBITS
_RAW: Final = -zlib.MAX_WBITS
_SUPPORTED: Final = ("gzip", "deflate")


class UnsupportedEncoding(HttpError):
    status = 415
    ends_connection = True

    def __init__(self, encoding: str) -> None:
        super().__init__(
            f"the request body's Content-Encoding {encoding!r} is not supported; send it "
            f"uncompressed or as {' or '.join(_SUPPORTED)}",
            headers={"Accept-Encoding": ", ".join(_SUPPORTED)},
        )


class _BadEncoding(BadRequest):
    ends_connection = True  # the rest of the body is not read

    def __init__(self, encoding: str, what: str) -> None:
        super().__init__(
            f"the request body is not valid {encoding} data ({what}); send it as "
            f"Content-Encoding {encoding} made by a standard library, or uncompressed"
        )


class BodyDecoder:
    """The decoded pieces of one body, fed as its encoded pieces arrive."""

    __slots__ = ("_encoding", "_head", "_inflater", "_started")

    def __init__(self, encoding: str) -> None:
        self._encoding = encoding
        self._inflater = zlib.decompressobj(_GZIP if encoding == "gzip" else _ZLIB)
        self._started = encoding != "deflate"  # only deflate's wrapper is told from its head
        #: The first byte of a deflate body, kept until the second tells its wrapper.
        self._head = b""

    def feed(self, data: bytes) -> Iterator[bytes]:
        """The decoded bytes of ``data``, in pieces of at most :data:`_PIECE` bytes."""
        if not self._started:
            data = self._head + data
            if len(data) < 2:  # a chunk of one byte: the wrapper is told by the next
                self._head = data
                return
            self._started = True
            self._head = b""
            # A zlib header (RFC 1950): deflate, and a check sum.
            if not (data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0):
                self._inflater = zlib.decompressobj(_RAW)
        while data:
            inflater = self._inflater
            try:
                piece = inflater.decompress(data, _PIECE)
            except zlib.error as exc:
                raise _BadEncoding(self._encoding, str(exc)) from None
            if piece:
                yield piece
            if inflater.eof:
                # gzip allows several members one after the other; anything else after the end
                # of the stream is not part of it.
                data = inflater.unused_data
                if data and self._encoding == "gzip":
                    self._inflater = zlib.decompressobj(_GZIP)
                elif data:
                    raise _BadEncoding(self._encoding, "bytes after the end of the stream")
            else:
                data = inflater.unconsumed_tail

    def finish(self) -> None:
        """The body ended: ``400`` when its encoded stream did not (a body cut short)."""
        if not self._inflater.eof:
            raise _BadEncoding(self._encoding, "the stream ends before its end")


def decoder_for(encoding: str | None) -> BodyDecoder | None:
    """The decoder of a ``Content-Encoding`` header's value (``None``: the body is as sent);
    :class:`UnsupportedEncoding` for one the front cannot undo."""
    if encoding is None:
        return None
    name = encoding.strip().lower()
    if name in ("", "identity"):
        return None
    if name == "x-gzip":
        name = "gzip"
    if name not in _SUPPORTED:
        raise UnsupportedEncoding(encoding)
    return BodyDecoder(name)
