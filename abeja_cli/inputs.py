"""Turn ``--input``/``--method``/``--content-type`` into the HTTP request sent to the model.

Everything here runs before an image is built or a server started (abeja-sdk's CLI read the input
only after its container was up, and left the container running when the file was bad).
Every problem is an :class:`~abeja_cli.errors.InputError` with a one-line message.

``--input`` forms:

* ``PATH`` - the body is the file's bytes, sent unchanged; ``Content-Type`` from the extension
  (``.json`` must hold valid JSON): the runtime's rule for request files
  (:mod:`abeja_runtime.request_files`), which ``--warmup`` replays the same way. ``-`` reads
  standard input.
* ``NAME=@PATH`` (optionally ``NAME=@PATH;type=MEDIA/TYPE``) - a file part of a
  ``multipart/form-data`` body; ``NAME=VALUE`` - a text field. Repeat ``--input`` for each part.
* With ``--method GET`` the request carries a query string instead of a body: ``NAME=VALUE``
  inputs are URL-encoded, or a ``PATH`` holds the raw query.
"""

from __future__ import annotations

import dataclasses
import re
import secrets
import sys
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final

from abeja_cli.errors import InputError
from abeja_runtime.limits import ALLOWED_METHODS
from abeja_runtime.media import DEFAULT_TYPE as _DEFAULT_TYPE
from abeja_runtime.request_files import (
    RequestFileError,
    Wording,
    read_bytes,
    read_request_file,
    resolve,
)

__all__ = [
    "METHODS",
    "ModelRequest",
    "build_request",
]

#: The runtime's own list: the CLI offers exactly what the runtime delivers to handlers.
METHODS: Final = ALLOWED_METHODS
#: Methods whose request may be sent without any ``--input``.
_BODYLESS: Final = frozenset({"GET", "DELETE"})
#: A form field name: what HTML forms and abeja-sdk's samples use. Anything else (a path
#: such as ``data/a=b.json``) is read as a file path.
_FIELD_RE: Final = re.compile(r"^(?P<name>[A-Za-z0-9_.\-\[\]]+)=(?P<value>.*)$", re.DOTALL)
_MEDIA_TYPE_RE: Final = re.compile(r"^[\w.+\-!#$&^]+/[\w.+\-!#$&^]+(\s*;.*)?$")
#: How errors name an ``--input`` file.
_INPUT_FILE: Final = Wording("input file", "--input", "pass --content-type to send it unchecked")


@dataclass(frozen=True)
class ModelRequest:
    """What ``run-local`` sends: method, target (``/`` plus query), headers and body."""

    method: str
    content_type: str | None
    body: bytes
    query: str = ""
    summary: str = ""
    path: str = "/"

    @property
    def target(self) -> str:
        return f"{self.path}?{self.query}" if self.query else self.path

    @property
    def headers(self) -> dict[str, str]:
        headers = {"Content-Length": str(len(self.body))}
        if self.content_type:
            headers["Content-Type"] = self.content_type
        return headers


@dataclass(frozen=True)
class _Part:
    name: str
    data: bytes
    file_name: str | None = None
    content_type: str | None = None


def build_request(
    inputs: Sequence[str],
    *,
    method: str = "POST",
    content_type: str | None = None,
    base_dir: Path | None = None,
    stdin: BinaryIO | None = None,
    path: str = "/",
) -> ModelRequest:
    """Read and validate the inputs; raise :class:`InputError` with one line on any problem."""
    if not path.startswith("/") or any(c in path for c in " ?#\r\n"):
        raise InputError(f"--path {path!r} must start with / and hold no spaces, ? or #")
    request = _build(
        inputs, method=method, content_type=content_type, base_dir=base_dir, stdin=stdin
    )
    # Non-ASCII is percent-encoded; what is already encoded and URL punctuation stay.
    quoted = urllib.parse.quote(path, safe="/%:@!$&'()*+,;=-._~")
    return dataclasses.replace(request, path=quoted)


def _build(
    inputs: Sequence[str],
    *,
    method: str,
    content_type: str | None,
    base_dir: Path | None,
    stdin: BinaryIO | None,
) -> ModelRequest:
    method = method.upper()
    if method not in METHODS:
        raise InputError(f"unsupported --method {method}; use one of {', '.join(METHODS)}")
    if content_type is not None and not _MEDIA_TYPE_RE.match(content_type.strip()):
        raise InputError(
            f"--content-type {content_type!r} is not a media type; write it like application/json"
        )
    base = base_dir or Path.cwd()
    fields = [m for m in (_as_field(spec, base) for spec in inputs) if m is not None]
    files = [spec for spec in inputs if _as_field(spec, base) is None]

    if not inputs:
        if method not in _BODYLESS:
            raise InputError(
                "missing --input: give the request body file, or NAME=VALUE / NAME=@PATH "
                "form fields"
            )
        return ModelRequest(method, content_type, b"", summary="no body")
    if files and fields:
        raise InputError(
            f"--input {files[0]} is a body file but other inputs are form fields; "
            "use NAME=@PATH for every file of a multipart form"
        )
    if len(files) > 1:
        raise InputError(
            f"only one body file can be sent, got {len(files)} (--input {files[0]}, "
            f"--input {files[1]}); use NAME=@PATH for each file of a multipart form"
        )
    if method == "GET":
        return _get_request(files, fields, base, stdin)
    if files:
        return _file_request(method, files[0], content_type, base, stdin)
    return _multipart_request(method, fields, content_type, base, stdin)


def _as_field(spec: str, base: Path) -> tuple[str, str] | None:
    """``(name, value)`` when ``spec`` is a form field, None when it names a body file."""
    match = _FIELD_RE.match(spec)
    if match is None or resolve(spec, base).exists():
        return None
    return match["name"], match["value"]


def _read(path: str, base: Path, stdin: BinaryIO | None) -> bytes:
    if path == "-":
        stream = stdin if stdin is not None else sys.stdin.buffer
        return stream.read()
    try:
        return read_bytes(path, base, _INPUT_FILE)
    except RequestFileError as exc:
        raise InputError(str(exc)) from None


def _body_file(
    path: str, given_type: str | None, base: Path, stdin: BinaryIO | None
) -> tuple[str, bytes]:
    """A body file's media type and bytes: ``given_type`` where there is one, octet-stream for
    standard input, else the runtime's rule for request files (the type of the file's name, a
    JSON file checked)."""
    if given_type is not None or path == "-":
        return given_type or _DEFAULT_TYPE, _read(path, base, stdin)
    try:
        file = read_request_file(path, base, _INPUT_FILE)
    except RequestFileError as exc:
        raise InputError(str(exc)) from None
    return file.content_type, file.body


def _file_request(
    method: str, path: str, content_type: str | None, base: Path, stdin: BinaryIO | None
) -> ModelRequest:
    content_type, data = _body_file(path, content_type, base, stdin)
    summary = f"{path} ({content_type}, {len(data)} bytes)"
    return ModelRequest(method, content_type, data, summary=summary)


def _get_request(
    files: list[str], fields: list[tuple[str, str]], base: Path, stdin: BinaryIO | None
) -> ModelRequest:
    if files:
        raw = _read(files[0], base, stdin).decode("utf-8", "replace").strip()
        query = raw.removeprefix("?")
    else:
        for name, value in fields:
            if value.startswith("@"):
                raise InputError(
                    f"--input {name}={value}: a GET request sends a query string, not files; "
                    "use NAME=VALUE, or --method POST"
                )
        query = urllib.parse.urlencode(fields)
    return ModelRequest("GET", None, b"", query=query, summary=f"query {query!r}")


def _multipart_request(
    method: str,
    fields: list[tuple[str, str]],
    content_type: str | None,
    base: Path,
    stdin: BinaryIO | None,
) -> ModelRequest:
    if content_type is not None and not content_type.lower().startswith("multipart/form-data"):
        raise InputError(
            f"--content-type {content_type} cannot be used with NAME=VALUE / NAME=@PATH inputs, "
            "which are sent as multipart/form-data"
        )
    parts = [_part(name, value, base, stdin) for name, value in fields]
    boundary = "abeja-" + secrets.token_hex(16)
    body = encode_multipart(parts, boundary)
    names = ", ".join(p.name for p in parts)
    return ModelRequest(
        method,
        f"multipart/form-data; boundary={boundary}",
        body,
        summary=f"multipart form ({names}; {len(body)} bytes)",
    )


def _part(name: str, value: str, base: Path, stdin: BinaryIO | None) -> _Part:
    if not value.startswith("@"):
        return _Part(name, value.encode("utf-8"))
    path, _, options = value[1:].partition(";type=")
    if not path:
        raise InputError(f"--input {name}={value}: no file name after '@'")
    part_type, data = _body_file(path, options.strip() or None, base, stdin)
    if options and not _MEDIA_TYPE_RE.match(part_type):
        raise InputError(f"--input {name}={value}: {part_type!r} is not a media type")
    file_name = "stdin" if path == "-" else Path(path).name
    return _Part(name, data, file_name, part_type)


def _quote(value: str) -> str:
    """Escape a name for a Content-Disposition parameter the way browsers do (HTML spec)."""
    return value.replace("\\", "\\\\").replace('"', "%22").replace("\r", "%0D").replace("\n", "%0A")


def encode_multipart(parts: Sequence[_Part], boundary: str) -> bytes:
    """A ``multipart/form-data`` body (RFC 7578) for the given parts."""
    chunks: list[bytes] = []
    for part in parts:
        disposition = f'form-data; name="{_quote(part.name)}"'
        if part.file_name is not None:
            disposition += f'; filename="{_quote(part.file_name)}"'
        head = f"--{boundary}\r\nContent-Disposition: {disposition}\r\n"
        if part.content_type:
            head += f"Content-Type: {part.content_type}\r\n"
        chunks += [head.encode("utf-8"), b"\r\n", part.data, b"\r\n"]
    chunks.append(f"--{boundary}--\r\n".encode("ascii"))
    return b"".join(chunks)
