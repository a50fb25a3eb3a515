"""Show the model's answer: JSON pretty-printed, everything else byte-exact.

abeja-sdk's CLI re-indented anything that parsed as JSON, escaped non-ASCII text, and added a
newline after binary bodies (so a returned JPEG was corrupted). Here a body is pretty-printed
only when its Content-Type says JSON, non-ASCII is kept as UTF-8, and other bodies are written
as they came. A body labelled JSON that is not (bytes a handler returned under
``application/json``) is said to be so, and, on a terminal, is binary like any other.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import BinaryIO

from abeja_cli.client import ModelResponse
from abeja_cli.console import Console
from abeja_cli.errors import CliError
from abeja_runtime.media import is_json_type

__all__ = ["render_body", "write_response"]


def render_body(response: ModelResponse) -> bytes:
    """The bytes shown on stdout for a response."""
    if is_json_type(response.content_type) and response.body:
        try:
            document = json.loads(response.body)
        except (ValueError, UnicodeDecodeError):
            return response.body  # JSON Lines or a malformed body: show it as it is
        return (json.dumps(document, indent=4, ensure_ascii=False) + "\n").encode("utf-8")
    return response.body


def write_response(
    response: ModelResponse, *, console: Console, stdout: BinaryIO, output: Path | None = None
) -> int:
    """Write the answer; return the exit code (0 for a 2xx status, 1 otherwise)."""
    if not response.ok:
        console.error(
            f"the model answered {response.status} {response.reason}".rstrip()
            + (f" ({response.content_type})" if response.content_type else "")
        )
        stdout.write(render_body(response))
        stdout.flush()
        return 1
    if response.passed_on and output is None:  # written as it came (a streamed text answer)
        return 0
    problem = _not_json(response)
    if output is not None:
        try:
            output.write_bytes(response.body)
        except OSError as exc:
            raise CliError(f"cannot write --output {output}: {exc.strerror or exc}") from None
        kind = response.content_type or "no content type"
        console.info(f"wrote {len(response.body)} bytes ({kind}) to {output}")
        if problem:
            console.warning(f"{problem}; check the content_type that the handler returns")
        return 0
    if _isatty(stdout) and _binary(response, json_ok=problem is None):
        # Raw image bytes would garble the terminal (curl refuses too); nothing is lost:
        # the user reruns with --output or a redirect.
        if problem:
            console.notice(
                f"{problem}; not printed to the terminal: save it with --output FILE, and check "
                "the content_type that the handler returns"
            )
            return 0
        kind = response.content_type or "binary data"
        console.notice(
            f"the answer is {len(response.body)} bytes of {kind}; not printed to the "
            "terminal: use --output FILE or redirect stdout"
        )
        return 0
    if problem:
        console.warning(
            f"{problem}; written as it came: save it with --output FILE, and check the "
            "content_type that the handler returns"
        )
    stdout.write(render_body(response))
    stdout.flush()
    return 0


def _not_json(response: ModelResponse) -> str | None:
    """What is wrong with an answer labelled JSON that is not, in words; None otherwise."""
    if not is_json_type(response.content_type) or not response.body:
        return None
    try:
        json.loads(response.body)
    except (ValueError, UnicodeDecodeError) as exc:
        found = f"{len(response.body)} bytes of binary data" if _undecodable(response.body) else exc
        return f"the answer is labelled {response.content_type} but is not JSON ({found})"
    return None


def _isatty(stream: BinaryIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _binary(response: ModelResponse, *, json_ok: bool) -> bool:
    """True when the body is neither declared as text (JSON only when it is: ``json_ok``) nor
    decodable as UTF-8."""
    media = response.content_type.split(";", 1)[0].strip().lower()
    if media.startswith("text/") or media.endswith(("xml", "csv")):
        return False
    if is_json_type(media) and json_ok:
        return False
    return _undecodable(response.body)


def _undecodable(body: bytes) -> bool:
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return b"\x00" in body
