"""The request a handler receives: ABEJA's read-only mapping, parts and header view.

The shapes copy ``abejaruntime`` 1.1.1 exactly (contract Part B 2.3), which users' handlers were
written against; what ABEJA Platform lost (path, decoded query) is offered as attributes, never
as keys, because code checks ``'key' in request``. Bodies are file objects, read once from the
start, that the runtime closes after the response has been sent.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any, Final, cast

from multidict import MultiDict, MultiDictProxy

from abeja_runtime.spool import Scratch

if TYPE_CHECKING:
    from abeja_runtime.worker.cancellation import Cancellations

__all__ = ["REQUEST_KEYS", "Content", "HttpHeaders", "Request", "was_iterated"]

REQUEST_KEYS: Final = ("http_method", "content_type", "headers", "http_headers", "contents")
_CONTENT_KEYS: Final = ("content_type", "metadata", "body", "file_name", "form_name")


class HttpHeaders:
    """Case-insensitive view over ``(lower-name, value)`` pairs, as ABEJA's ``HttpHeaders``.

    ``h['X-Name']`` gives the *last* value or ``None`` (no ``KeyError``), ``h.get_all(name)`` every
    value, ``len(h)`` the number of pairs, and iteration yields ``(name, value)`` tuples.
    """

    __slots__ = ("_pairs",)

    def __init__(self, pairs: Sequence[tuple[str, str]]) -> None:
        self._pairs = tuple((name.lower(), value) for name, value in pairs)

    def __getitem__(self, name: str) -> str | None:
        return cast("str | None", self.get(name))

    def get(self, name: str, default: Any = None) -> Any:
        wanted = name.lower()
        for key, value in reversed(self._pairs):
            if key == wanted:
                return value
        return default

    def get_all(self, name: str) -> list[str]:
        wanted = name.lower()
        return [value for key, value in self._pairs if key == wanted]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and any(key == name.lower() for key, _ in self._pairs)

    def __len__(self) -> int:
        return len(self._pairs)

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self._pairs)

    def items(self) -> list[tuple[str, str]]:
        return list(self._pairs)

    def keys(self) -> list[str]:
        return [key for key, _ in self._pairs]

    def values(self) -> list[str]:
        return [value for _, value in self._pairs]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, HttpHeaders):
            return NotImplemented
        return set(self._pairs) == set(other._pairs)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"HttpHeaders({list(self._pairs)!r})"


class Content(Mapping[str, Any]):
    """One body: the whole request body, or one multipart part. A mapping of ``content_type``,
    ``metadata``, ``body`` (an open binary file object), ``file_name`` and ``form_name`` (absent
    values ``None``) that equals a plain dict with the same items, as on ABEJA Platform."""

    __slots__ = ("_values",)

    def __init__(
        self,
        body: IO[bytes] | None,
        *,
        content_type: str | None = None,
        file_name: str | None = None,
        form_name: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        self._values: dict[str, Any] = {
            "content_type": content_type,
            "metadata": metadata,
            "body": body,
            "file_name": file_name,
            "form_name": form_name,
        }

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(_CONTENT_KEYS)

    def __len__(self) -> int:
        return len(_CONTENT_KEYS)

    def read(self, size: int = -1) -> bytes:
        """Read from the body; ``ValueError('no body')`` when there is none, as on ABEJA
        Platform."""
        body: IO[bytes] | None = self._values["body"]
        if body is None:
            raise ValueError("no body")
        return body.read(size)

    def close(self) -> None:
        body = self._values["body"]
        if body is not None:
            body.close()

    def __repr__(self) -> str:
        shown = {key: value for key, value in self._values.items() if key != "body"}
        return f"Content({shown!r})"


class Request(Mapping[str, Any]):
    """What ``handler(request, context)`` receives.

    Keys: ``http_method``, ``content_type``, ``headers`` (ABEJA's list of
    ``{'key': name, 'values': [...]}``, sorted by name), ``http_headers`` (:class:`HttpHeaders`) and
    ``contents`` (list of :class:`Content`). Attributes beyond ABEJA Platform: ``path`` (the decoded
    URL path), ``query`` (the decoded query as a read-only multi-dict), ``query_string`` (raw),
    ``request_id`` and ``cancelled``.
    """

    __slots__ = (
        "_cancellation",
        "_iterated",
        "_raw_headers",
        "_scratch",
        "_values",
        "path",
        "query",
        "query_string",
        "request_id",
    )

    def __init__(
        self,
        *,
        http_method: str,
        content_type: str,
        headers: Sequence[tuple[str, str]],
        contents: list[Content],
        path: str = "/",
        query: MultiDictProxy[str] | None = None,
        query_string: str = "",
        request_id: str = "",
        scratch: Scratch | None = None,
    ) -> None:
        # The two header views are built on first use: most handlers never look at them.
        self._raw_headers = headers
        self._values: dict[str, Any] = {
            "http_method": http_method,
            "content_type": content_type,
            "contents": contents,
        }
        self.path = path
        self.query = query if query is not None else MultiDictProxy(MultiDict())
        self.query_string = query_string
        self.request_id = request_id
        self._scratch = scratch
        self._cancellation: tuple[Cancellations, int] | None = None
        self._iterated = False

    def watch_cancellation(self, cancellations: Cancellations, call_id: int) -> None:
        """Where :attr:`cancelled` looks (the worker's call ``call_id``)."""
        self._cancellation = (cancellations, call_id)

    @property
    def cancelled(self) -> threading.Event:
        """Set once nobody waits for this call's answer any more (its client left, or its
        deadline passed): a long ``def`` handler may look now and then, and stop. Never set
        for a request that is not a call from the front (a batch run's)."""
        if self._cancellation is None:
            return threading.Event()
        cancellations, call_id = self._cancellation
        return cancellations.event(call_id)

    def __getitem__(self, key: str) -> Any:
        try:
            return self._values[key]
        except KeyError:
            if key in ("headers", "http_headers"):
                self._build_header_views()
                return self._values[key]
            if key == "metadata":
                # ABEJA's special case: datalake metadata of the first body (None over HTTP).
                contents = self._values["contents"]
                if not contents:
                    raise ValueError("no content") from None
                return contents[0]["metadata"]
            raise

    def _build_header_views(self) -> None:
        names: dict[str, list[str]] = {}
        for name, value in self._raw_headers:
            names.setdefault(name.lower(), []).append(value)
        header_list = [{"key": key, "values": names[key]} for key in sorted(names)]
        pairs = [(key, value) for key in sorted(names) for value in names[key]]
        self._values["headers"] = header_list
        self._values["http_headers"] = HttpHeaders(pairs)

    def __iter__(self) -> Iterator[str]:
        self._iterated = True
        return iter(REQUEST_KEYS)

    def __len__(self) -> int:
        return len(REQUEST_KEYS)

    def __contains__(self, key: object) -> bool:
        return key in REQUEST_KEYS

    __eq__ = object.__eq__
    __hash__ = object.__hash__

    def read(self, size: int = -1) -> bytes:
        """Read from the first body, so that ``json.load(request)`` works."""
        contents: list[Content] = self._values["contents"]
        if not contents:
            raise ValueError("no body")
        return contents[0].read(size)

    def close(self) -> None:
        """Close every body and remove the request's spool directory, if one was made."""
        for content in self._values["contents"]:
            content.close()
        if self._scratch is not None:
            self._scratch.remove()

    def __repr__(self) -> str:
        return (
            f"<Request {self._values['http_method']} {self.path} "
            f"content_type={self._values['content_type']!r} "
            f"contents={len(self._values['contents'])}>"
        )


def was_iterated(request: Request) -> bool:
    """Whether code went over ``request``'s keys (``for item in request``, ``dict(request)``):
    what a handler written for a list of requests does with the one request it is handed."""
    return request._iterated
