"""How long a call takes, as the front sees it (from when it was sent, or its process's
previous answer came, to its answer): what the scheduler places calls by (quick calls join a
process that is serving already) and judges deadlines by (the wait ahead of a call, and the
latest a call may start to answer in time)."""

from __future__ import annotations

from typing import Final

__all__ = ["CallTime"]

#: The weight of the last call in the running means, once the first ones are in.
_WEIGHT: Final = 0.1
#: How long after the last answer the estimate still refuses calls while none is in the pool.
_TRUSTED_FOR: Final = 1.0


class CallTime:
    """The running mean of a call's time and of how far a call is from it (its spread)."""

    __slots__ = ("answered_at", "mean", "measured", "spread")

    def __init__(self) -> None:
        #: Seconds; before any call was answered, a slow call's (no call joins a busy process).
        self.mean = 1.0
        self.spread = 0.0
        #: How many calls were measured, and when the last one was answered (the clock's).
        self.measured = 0
        self.answered_at = 0.0

    def add(self, busy: float, now: float) -> None:
        """A call answered at ``now`` took ``busy`` seconds: the plain means of the first ones (a
        slow first call weighs as one of them, not for many calls after), then the running ones,
        where a call longer than twice :meth:`bound` counts as that long (one very long call
        moves the estimate a step, not all the way)."""
        self.answered_at = now
        self.measured += 1
        if self.measured == 1:
            self.mean = busy
            return
        weight = 1 / self.measured
        if weight < _WEIGHT:
            weight, busy = _WEIGHT, min(busy, 2 * self.bound())
        off = busy - self.mean
        self.mean += weight * off
        self.spread += weight * (abs(off) - self.spread)

    def bound(self) -> float:
        """The time a call takes, but rarely more: the mean and four times its spread (as TCP
        bounds a round trip)."""
        return self.mean + 4 * self.spread

    def expected(self, ahead: int | None, slots: int) -> float:
        """The seconds until a call that joins now is answered: its own call, after (``None``:
        a slot is free) the ``ahead`` calls that go before it and the one that frees its slot,
        each a mean call, shared by the ``slots``."""
        wait = 0.0 if ahead is None else (ahead + 1) * self.mean / slots
        return wait + self.mean

    def trusted(self, calls_in_pool: int, now: float) -> bool:
        """Whether the estimate may refuse calls now: once a call was measured, while calls
        are in the pool or for :data:`_TRUSTED_FOR` after the last answer. Else a call goes
        and measures the handler again (an estimate made slow by long calls would otherwise
        refuse every call, and never be measured again)."""
        return self.measured > 0 and (calls_in_pool > 0 or now - self.answered_at < _TRUSTED_FOR)
