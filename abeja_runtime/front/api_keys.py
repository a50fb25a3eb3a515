"""API keys (``--api-keys``, ``--api-keys-file``, :class:`ApiKeys`): with any given, the service
port and gRPC serve only callers that send one of them, as ``Authorization: Bearer KEY`` or
``X-API-Key: KEY`` (gRPC: the same names in its metadata); others are answered ``401``. The
health port, and ``/health_check`` on the service port, never ask: balancers and the kubelet
probe them without a key.

A key is an item of the setting or of a line of the file (comma-separated in both; lines that
begin with ``#`` are comments). It is compared in constant time, as its SHA-256 against each
key's, every key every time, so that neither the time of the answer nor its wait tells which key
was near. A caller is named in the access record by the first 8 hex digits of its key's SHA-256,
never by the key: keys must be long and random, as a short one could be guessed from it.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final

from abeja_runtime.config import Config
from abeja_runtime.errors import Unauthorized

__all__ = ["ApiKeys", "api_keys"]

_BEARER: Final = "bearer "


def api_keys(config: Config) -> ApiKeys | None:
    """The keys of ``--api-keys`` and ``--api-keys-file``, or ``None`` when none is given;
    ``ValueError`` with a sentence when the file cannot be read or holds none."""
    keys = [key.strip() for key in config.api_keys.split(",") if key.strip()]
    if config.api_keys_file:
        path = Path(config.api_keys_file)
        try:
            lines = path.read_text("utf-8-sig").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "it is not UTF-8 text"
            raise ValueError(
                f"cannot read the API keys of --api-keys-file (ABEJA_RUNTIME_API_KEYS_FILE) "
                f"{path}: {reason}; give a readable file, one key a line"
            ) from None
        found = [
            key.strip()
            for line in lines
            if not line.strip().startswith("#")
            for key in line.split(",")  # (the variable's form, as a Secret's literal may be)
            if key.strip()
        ]
        if not found:
            raise ValueError(
                f"--api-keys-file (ABEJA_RUNTIME_API_KEYS_FILE) {path} holds no key; write one "
                "key a line (lines beginning with # are comments)"
            )
        keys += found
    return ApiKeys(keys) if keys else None


class ApiKeys:
    """The keys a caller may send (see the module)."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._digests = tuple({_digest(key) for key in keys})

    def __len__(self) -> int:
        return len(self._digests)

    def caller(self, headers: Mapping[str, str]) -> str:
        """The name of the caller whose request has these ``headers`` (or gRPC metadata, its
        names in lower case): its key's short hash; :class:`Unauthorized` without a key given."""
        sent = _sent(headers)
        if sent is None:
            raise Unauthorized(sent=False)
        digest = _digest(sent)
        known = False
        for given in self._digests:  # every one: the time says nothing of which
            known |= hmac.compare_digest(digest, given)
        if not known:
            raise Unauthorized(sent=True)
        return digest.hex()[:8]


def _sent(headers: Mapping[str, str]) -> str | None:
    authorization = headers.get("authorization")
    if authorization is not None and authorization[:7].lower() == _BEARER:
        return authorization[7:].strip()
    return headers.get("x-api-key")


def _digest(key: str) -> bytes:
    """As the key's bytes were sent: a header's bytes that are not UTF-8 come as lone
    surrogates (aiohttp decodes them so), and go back to themselves."""
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()
