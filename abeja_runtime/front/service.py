"""Where calls begin (:class:`CallService`): each way in (aiohttp's request handling in
``server.py``, the direct path, gRPC) parses its request into a :class:`CallHead` and begins a
:class:`~abeja_runtime.front.call.FrontCall` with it; the service holds what calls share (the
pool, the deadlines, the places for bodies, the accounting, the traces) and says whether the
front is ready or draining. The direct path asks first whether the pool would refuse the request
at once (:meth:`CallService.turned_away`): it is refused at the door, no call begun for it.

A call's deadline is the nearer of ``--timeout`` and what its caller says it waits. An HTTP
caller says it in a header: ``--deadline-header`` (by default Envoy's
``x-envoy-expected-rq-timeout-ms``, which Istio and Envoy-based gateways send), milliseconds when
its name ends in ``-ms``, else seconds; and ``Request-Timeout``, in seconds. A gRPC caller's
deadline is gRPC's own (``grpc-timeout``). A value that is not a positive number is ignored: a
gateway's header never breaks a request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Final, NamedTuple

from abeja_runtime.config import Config
from abeja_runtime.errors import HttpError, deadline_passed
from abeja_runtime.front.accounting import Accounting, CallEntry
from abeja_runtime.front.api_keys import ApiKeys
from abeja_runtime.front.body import BodyPlaces
from abeja_runtime.front.call import FrontCall, Responder
from abeja_runtime.front.deadlines import Deadlines
from abeja_runtime.front.pending import PendingCall
from abeja_runtime.front.pool import HandlerPool
from abeja_runtime.front.tenants import NORMAL, OTHER, PRIORITIES, Tenants
from abeja_runtime.metrics import FrontMetrics

__all__ = ["CallHead", "CallService"]

#: The plain header read besides ``--deadline-header``: seconds.
_REQUEST_TIMEOUT: Final = "request-timeout"
#: Longer than this (a year) is no deadline (also ``inf``, and NaN, which fails every test).
_LONGEST: Final = 365 * 24 * 3600.0


class CallHead(NamedTuple):
    """What a call's access entry and span are opened with, as a way in parsed it."""

    method: str
    #: The request's path (a gRPC call's method).
    path: str
    received: float
    request_id: str
    requester_id: str | None = None
    #: Where the caller's trace context is (the request's headers, a gRPC call's metadata):
    #: an HTTP caller's deadline header too.
    carrier: Any = None
    rpc: bool = False
    #: A gRPC caller's deadline: the seconds it has left (an HTTP caller's is in its headers).
    budget: float | None = None


class CallService:
    """Begins calls and holds what they share (see the module)."""

    def __init__(
        self,
        config: Config,
        pool: HandlerPool,
        metrics: FrontMetrics,
        keys: ApiKeys | None = None,
    ) -> None:
        """``keys``: the API keys a caller must send (``None``: none is asked)."""
        self.pool = pool
        self.keys = keys
        self.metrics = metrics
        #: Kept: on Python 3.11 each asyncio.get_running_loop() is a getpid() system call.
        self.loop = asyncio.get_running_loop()
        #: Every call's deadline is this many seconds after its request came (``None``: none).
        self.timeout = config.timeout or None
        #: The longest a streamed answer may go without progress, and may last (``None``: no
        #: limit; see :mod:`~abeja_runtime.stream_limits`).
        self.stream_idle = config.stream_idle_timeout or None
        self.stream_timeout = config.stream_timeout or None
        #: The places and buffers of bodies above the inline limit.
        self.bodies = BodyPlaces(config, pool, self.loop)
        self.deadlines = Deadlines(self.loop, self._expire)
        named = config.deadline_header.strip().lower()
        #: The headers a caller's deadline is read from, each with the seconds of its unit.
        self._deadline_headers = tuple(
            (name, 0.001 if name.endswith("-ms") else 1.0)
            for name in dict.fromkeys(filter(None, (named, _REQUEST_TIMEOUT)))
        )
        pool.scheduler.expired = self._timed_out
        #: Whose each call is, and its priority class (``None``: all alike, in arrival order).
        self.tenants: Tenants | None = Tenants(config)
        if self.tenants.on:
            pool.scheduler.order_by(self.tenants.weights, config.priority_aging)
            metrics.tenants((*self.tenants.weights, OTHER))
        else:
            self.tenants = None
        #: Every call's counts and spans, and the calls in flight, which the drain waits for.
        self.accounting = Accounting(config, metrics)
        #: Set at SIGTERM: readiness says 503 and every answer closes its connection; calls are
        #: still taken (balancers send until they see readiness fail), until the service port
        #: stops accepting and gRPC stops (``serving.py``).
        self.draining = False

    def begin(self, head: CallHead, responder: Responder) -> FrontCall:
        """A call of a parsed request: counted in flight, its span begun, until it finishes."""
        given, deadline, budget = self._deadline(head)
        entry = self._open(head, given)
        call = FrontCall(self, entry, responder)
        call.deadline, call.caller_budget = deadline, budget
        tenants = self.tenants
        if tenants is not None and head.carrier is not None:
            call.priority = tenants.priority(head.carrier)
            if not tenants.by_key:  # (else known once its key was checked: at its submit)
                call.tenant = tenants.tenant(head.carrier, None)
        return call

    def turned_away(self, head: CallHead, caller: str | None) -> CallEntry | None:
        """The entry of a request refused at the door, no call begun for it, when the pool
        would refuse its call at once (its tenant holds its share of the queue, or the queue is
        full with no call of a lower class to make room): the way in answers it ``503`` and
        ends the entry, counted as the pool's refusal is, for a fraction of a call's cost.
        ``None``: its call begins. ``caller``: its API key's short hash, with keys on."""
        tenants = self.tenants
        tenant, priority = "", NORMAL
        if tenants is not None:
            tenant, priority = tenants.tenant(head.carrier, caller), tenants.priority(head.carrier)
        scheduler = self.pool.scheduler
        if not scheduler.turns_away(tenant, priority):  # (most requests: nothing more asked)
            return None
        given, deadline, budget = self._deadline(head)
        if budget:  # a deadline before --timeout's: its call refuses it for that first
            assert deadline is not None
            try:
                scheduler.admit_before(deadline, budget, tenant, priority)
            except HttpError:
                return None
        metrics = self.metrics
        metrics.rejected("busy")
        if tenants is not None:
            metrics.tenant_call(tenants.label(tenant), False)
        entry = self._open(head, given)
        if caller is not None:
            entry.note("caller", caller)
        if tenants is not None:
            entry.note("tenant", tenant)
            entry.note("priority", PRIORITIES[priority])
        return entry

    def _deadline(self, head: CallHead) -> tuple[float | None, float | None, float]:
        """A call's deadline, from its head: the seconds its caller gave (``None``: none), its
        deadline (``time.time()``; ``None``: none), the nearer of theirs and ``--timeout``'s,
        and its caller's seconds again when they set it (0: ``--timeout`` did, or none)."""
        given = head.budget
        if given is None and head.carrier is not None and not head.rpc:
            given = self._budget(head.carrier)
        timeout = self.timeout
        if given is None:  # (most calls)
            return None, None if timeout is None else head.received + timeout, 0.0
        if timeout is not None and timeout <= given:
            return given, head.received + timeout, 0.0
        return given, head.received + given, given

    def _budget(self, headers: Mapping[str, str]) -> float | None:
        """The seconds the caller of a request with these ``headers`` waits, if it says so (the
        smallest it says)."""
        found: float | None = None
        for name, unit in self._deadline_headers:
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

    def _open(self, head: CallHead, given: float | None) -> CallEntry:
        """The entry of a request with this head, counted in flight until it ends (``given``:
        its caller's seconds, noted)."""
        entry = self.accounting.open(
            head.method, head.path, head.received, head.request_id, head.requester_id,
            head.carrier, rpc=head.rpc,
        )  # fmt: skip
        if given is not None:
            entry.note("deadline", round(given, 6))
        return entry

    def caller(self, headers: Mapping[str, str]) -> str | None:
        """Who sends a request with these ``headers`` (or gRPC metadata), with API keys on: its
        key's short hash, or :class:`~abeja_runtime.errors.Unauthorized`; ``None`` with none."""
        return None if self.keys is None else self.keys.caller(headers)

    @property
    def admitting(self) -> bool:
        """Whether a call can be handed to the pool now (else it is answered 503)."""
        return self.pool.admitting

    @property
    def ready(self) -> bool:
        """Readiness: a handler process is ready, and the front is not draining."""
        return self.pool.serving and not self.draining

    def _expire(self, pending: PendingCall) -> None:
        """``pending``'s deadline passed: answered ``504``, withdrawn from the pool."""
        if not pending.answer.done():
            self._timed_out(pending)
            self.pool.withdraw(pending)

    def _timed_out(self, pending: PendingCall, late: HttpError | None = None) -> None:
        """``pending`` is answered ``504``: its deadline passed, or it is ``late`` to start."""
        if pending.answer.done():
            return
        if late is None:
            late = deadline_passed(pending.caller_budget, self.timeout or 0.0)
        pending.answer.set_exception(late)
