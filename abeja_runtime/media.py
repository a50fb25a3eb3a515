"""Media types and file names, both ways, the same on every machine.

``guess_content_type`` gives a file's ``Content-Type`` from its extension: what
``abeja model run-local --input FILE`` sends, what ``--warmup FILE`` replays and what
``abeja-runtime batch`` gives the handler for an input file; ``is_json_type`` tells JSON's
media types apart (a request file of one must parse). ``extension_for`` is ABEJA's table the
other way, for the files that answers are written to (batch outputs, DataLake uploads).
"""

from __future__ import annotations

import functools
import mimetypes
from typing import Final

__all__ = ["DEFAULT_TYPE", "extension_for", "guess_content_type", "is_json_type"]

DEFAULT_TYPE: Final = "application/octet-stream"


@functools.cache
def _types() -> mimetypes.MimeTypes:
    """The built-in table only (/etc/mime.types differs between machines, and the same file
    must get the same Content-Type everywhere), made on first use: half a MiB that a process
    serving no file's request never holds."""
    types = mimetypes.MimeTypes(filenames=())
    for extension, media_type in {
        ".jsonl": "application/x-ndjson",
        ".ndjson": "application/x-ndjson",
        ".webp": "image/webp",
        ".npy": "application/octet-stream",
    }.items():
        types.add_type(media_type, extension)
    return types


#: ABEJA's extensions for media types (``util/mimetype_helper.go``).
_EXTENSIONS: Final = {
    "application/javascript": ".js",
    "application/json": ".json",
    "application/pdf": ".pdf",
    "application/x-www-form-urlencoded": ".txt",
    "audio/midi": ".midi",
    "audio/mpeg": ".mpg",
    "audio/ogg": ".oga",
    "audio/wav": ".wav",
    "audio/webm": ".webm",
    "image/bmp": ".bmp",
    "image/gif": ".gif",
    "image/jpeg": ".jpg",
    "image/png": ".png",
    "image/svg+xml": ".svg",
    "image/webp": ".webp",
    "text/csv": ".csv",
    "text/html": ".html",
    "text/markdown": ".md",
    "text/plain": ".txt",
    "text/xml": ".xml",
    "video/avi": ".avi",
    "video/mp4": ".mp4",
    "video/ogg": ".ogv",
    "video/quicktime": ".qt",
    "video/webm": ".webm",
    "video/x-matroska": ".mkv",
}


def guess_content_type(path: str) -> str:
    """The media type for a file name, from its extension; octet-stream when unknown."""
    guessed, _encoding = _types().guess_type(path, strict=False)
    return guessed or DEFAULT_TYPE


def is_json_type(content_type: str | None) -> bool:
    """True for ``application/json`` and ``*/*+json`` media types (parameters ignored)."""
    if not content_type:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def extension_for(content_type: str) -> str:
    """ABEJA's file extension for a content type: its table, else ``.txt`` for text and
    ``.bin`` for anything else."""
    media = content_type.partition(";")[0].strip().lower()
    if media in _EXTENSIONS:
        return _EXTENSIONS[media]
    return ".txt" if not media or media.startswith("text") else ".bin"
