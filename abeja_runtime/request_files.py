"""Request files: a file whose bytes are a request's body, its ``Content-Type`` from its name.

One rule for what ``abeja model run-local --input FILE`` sends and what ``--warmup FILE`` replays
through each handler process before it counts as ready (``worker/warmup.py``), so that a file that
warms a handler up is the request that run-local would send it: a POST of the file's bytes,
unchanged, with the media type of its extension (:func:`~abeja_runtime.media.guess_content_type`);
a JSON type must hold valid JSON, since a handler's JSON parse would fail on it anyway. Every
problem is a :class:`RequestFileError` whose message is one line naming the file and what to do;
the command line that takes the file (``abeja_cli/inputs.py``, the runtime's ``main.py``) reports
it and exits 2.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from abeja_runtime.errors import AbejaRuntimeError
from abeja_runtime.media import guess_content_type, is_json_type

__all__ = [
    "WARMUP_FILE",
    "RequestFile",
    "RequestFileError",
    "Wording",
    "read_bytes",
    "read_request_file",
    "resolve",
]


class RequestFileError(AbejaRuntimeError):
    """A request file that cannot be sent; the message is one line that says what to do."""


@dataclass(frozen=True, slots=True)
class Wording:
    """How errors name a kind of request file and the option that gives it."""

    #: ``input file``, ``warm-up file``.
    what: str
    #: The option, as a user reads it: ``--input``.
    option: str
    #: What else to do about a JSON file that does not parse (after "fix it, or").
    unchecked: str = ""


#: ``--warmup``'s files: checked by the front at start, read by each handler process.
WARMUP_FILE: Final = Wording("warm-up file", "--warmup (ABEJA_RUNTIME_WARMUP)")


@dataclass(frozen=True, slots=True)
class RequestFile:
    """A request file's body and media type."""

    content_type: str
    body: bytes


def resolve(path: str, base: Path) -> Path:
    """``path`` (``~`` expanded) as an absolute path, a relative one taken from ``base``."""
    candidate = Path(path).expanduser()
    return candidate if candidate.is_absolute() else base / candidate


def read_request_file(path: str, base: Path, wording: Wording) -> RequestFile:
    """The file's bytes and the media type of its name; a JSON type must parse."""
    body = read_bytes(path, base, wording)
    content_type = guess_content_type(path)
    if is_json_type(content_type):
        _check_json(body, path, wording)
    return RequestFile(content_type, body)


def read_bytes(path: str, base: Path, wording: Wording) -> bytes:
    """The file's bytes, or a :class:`RequestFileError` that says why they cannot be read."""
    what, option = wording.what, wording.option
    try:
        return resolve(path, base).read_bytes()
    except FileNotFoundError:
        message = f"{what} not found: {path}; check the path given to {option}"
    except IsADirectoryError:
        message = f"{what} {path} is a directory; {option} needs a file"
    except PermissionError:
        message = f"cannot read {what} {path}: permission denied; check its permissions"
    except OSError as exc:
        message = f"cannot read {what} {path}: {exc.strerror or exc}"
    raise RequestFileError(message)


def _check_json(data: bytes, path: str, wording: Wording) -> None:
    try:
        json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        # json.JSONDecodeError.__str__ already says "... line L column C (char N)".
        otherwise = f", or {wording.unchecked}" if wording.unchecked else ""
        raise RequestFileError(
            f"{wording.what} {path} is not valid JSON ({exc}); fix it{otherwise}"
        ) from None
