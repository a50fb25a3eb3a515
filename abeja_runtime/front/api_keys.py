"""API keys (``--api-keys``, ``--api-keys-file``, :class:`ApiKeys`): with any given, the service
port and gRPC serve only callers that send one of them, as ``Authorization: Bearer KEY`` or
``X-API-Key: KEY`` (gRPC: the same names in its metadata); others are answered ``401``. The
health port, and ``/health_check`` on the service port, never ask: balancers and the kubelet
probe them without a key.

A key is an item of the setting or of a line of the file (comma-separated in both; lines that
begin with ``#`` are comments). The file is read again when it changes (looked at once a second,
as calls come): a Kubernetes Secret's keys rotate without a restart. A file that can no longer
be read, or holds no key, leaves the keys read before in force, and says so.

A key is compared in constant time, as its SHA-256 against each key's, every key every time, so
that neither the time of the answer nor its wait tells which key was near. A caller is named in
the access record by the first 8 hex digits of its key's SHA-256, never by the key: keys must
be long and random, as a short one could be guessed from it.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final

from abeja_runtime.config import Config
from abeja_runtime.errors import Unauthorized

__all__ = ["ApiKeys", "api_keys"]

_log = logging.getLogger("abeja_runtime")
_BEARER: Final = "bearer "
#: How often the keys' file is looked at (its ``stat``), at most, for a change.
_LOOK_EVERY: Final = 1.0


def api_keys(config: Config) -> ApiKeys | None:
    """The keys of ``--api-keys`` and ``--api-keys-file``, or ``None`` when none is given;
    ``ValueError`` with a sentence when the file cannot be read or holds none."""
    keys = [key.strip() for key in config.api_keys.split(",") if key.strip()]
    if config.api_keys and not keys:  # (a Secret rendered empty must not leave the port open)
        raise ValueError(
            f"--api-keys (ABEJA_RUNTIME_API_KEYS) {config.api_keys!r} holds no key; give the "
            "keys separated by commas, or leave it unset to ask for none"
        )
    if not config.api_keys_file:
        return ApiKeys(keys) if keys else None
    return ApiKeys(keys, Path(config.api_keys_file))


class ApiKeys:
    """The keys a caller may send (see the module): the setting's, and the file's as it is."""

    def __init__(self, keys: Iterable[str], file: Path | None = None) -> None:
        self._given = tuple(keys)
        self._file = file
        #: The file's identity when it was read (``None``: gone, or never read).
        self._seen: tuple[int, int, int, int] | None = None
        self._digests = self._digests_of(self._read() if file is not None else [])
        #: When the file is looked at next (``time.monotonic()``).
        self._look_at = time.monotonic() + _LOOK_EVERY

    def _digests_of(self, found: list[str]) -> tuple[bytes, ...]:
        return tuple({_digest(key) for key in (*self._given, *found)})

    def __len__(self) -> int:
        return len(self._digests)

    def _signature(self) -> tuple[int, int, int, int] | None:
        """The file's identity: a new inode (as the kubelet swaps a Secret's files), new
        content in place, or gone (``None``) tells a change."""
        assert self._file is not None
        try:
            found = os.stat(self._file)
        except OSError:
            return None
        return (found.st_dev, found.st_ino, found.st_mtime_ns, found.st_size)

    def _read(self) -> list[str]:
        """The file's keys; ``ValueError`` with a sentence when it cannot be read or holds
        none."""
        assert self._file is not None
        self._seen = self._signature()
        try:
            lines = self._file.read_text("utf-8-sig").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "it is not UTF-8 text"
            raise ValueError(
                f"cannot read the API keys of --api-keys-file (ABEJA_RUNTIME_API_KEYS_FILE) "
                f"{self._file}: {reason}; give a readable file, one key a line"
            ) from None
        keys = [
            key.strip()
            for line in lines
            if not line.strip().startswith("#")
            for key in line.split(",")  # (the variable's form, as a Secret's literal may be)
            if key.strip()
        ]
        if not keys:
            raise ValueError(
                f"--api-keys-file (ABEJA_RUNTIME_API_KEYS_FILE) {self._file} holds no key; "
                "write one key a line (lines beginning with # are comments)"
            )
        return keys

    def _look(self) -> None:
        """Read the file again if it changed (each change said once); a file without keys
        leaves the old ones."""
        if self._signature() == self._seen:
            return
        try:
            found = self._read()
        except ValueError as exc:
            _log.warning("%s; the keys read before stay in force", exc)
            return
        self._digests = self._digests_of(found)
        _log.info("read the API keys of %s again: %d key(s) in force", self._file, len(self))

    def caller(self, headers: Mapping[str, str]) -> str:
        """The name of the caller whose request has these ``headers`` (or gRPC metadata, its
        names in lower case): its key's short hash; :class:`Unauthorized` without a key given."""
        if self._file is not None and (now := time.monotonic()) >= self._look_at:
            self._look_at = now + _LOOK_EVERY
            self._look()
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
