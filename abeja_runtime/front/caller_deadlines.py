"""The caller's own time limit: a call's deadline is the nearer of ``--timeout`` and what the
caller says it waits (:class:`CallerDeadlines`).

An HTTP caller says it in a header: ``--deadline-header`` (by default Envoy's
``x-envoy-expected-rq-timeout-ms``, which Istio and Envoy-based gateways send), milliseconds when
its name ends in ``-ms``, else seconds; and ``Request-Timeout``, in seconds. A gRPC caller's
deadline is gRPC's own (``grpc-timeout``). A value that is not a positive number is ignored: a
gateway's header never breaks a request.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from abeja_runtime.config import Config

__all__ = ["REQUEST_TIMEOUT", "CallerDeadlines"]

#: The plain header read besides ``--deadline-header``: seconds.
REQUEST_TIMEOUT: Final = "request-timeout"
#: Longer than this (a year) is no deadline (also ``inf``, and NaN, which fails every test).
_LONGEST: Final = 365 * 24 * 3600.0


class CallerDeadlines:
    """The seconds each caller gives a call (:meth:`budget`), within ``--timeout``."""

    __slots__ = ("_headers", "timeout")

    def __init__(self, config: Config) -> None:
        #: ``--timeout`` (``None``: no limit of the runtime's own).
        self.timeout: float | None = config.timeout or None
        named = config.deadline_header.strip().lower()
        #: The headers read, each with the seconds one of its units is.
        self._headers: tuple[tuple[str, float], ...] = tuple(
            (name, 0.001 if name.endswith("-ms") else 1.0)
            for name in dict.fromkeys(filter(None, (named, REQUEST_TIMEOUT)))
        )

    def budget(self, headers: Mapping[str, str]) -> float | None:
        """The seconds the caller of a request with these ``headers`` waits, if it says so (the
        smallest it says)."""
        found: float | None = None
        for name, unit in self._headers:
            text = headers.get(name)
            if text is None:
                continue
            try:
                seconds = float(text) * unit
            except ValueError:
                continue
            if 0 < seconds < _LONGEST and (found is None or seconds < found):
                found = seconds
        return found

    def deadline(self, received: float, budget: float | None) -> float | None:
        """When a call received at ``received`` must be answered by: ``--timeout`` after it, or
        sooner when its caller's ``budget`` says so (``None``: never)."""
        timeout = self.timeout
        if budget is None:
            return None if timeout is None else received + timeout
        return received + (budget if timeout is None else min(budget, timeout))
