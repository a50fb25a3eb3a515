"""The estimate of a call's time (``front/call_time.py``) that deadlines are judged by."""

from __future__ import annotations

import pytest

from abeja_runtime.front.call_time import CallTime


def measured(*times: float) -> CallTime:
    estimate = CallTime()
    for time in times:
        estimate.add(time, 0.0)
    return estimate


def test_the_first_calls_weigh_alike() -> None:
    # A slow first call (a lazy load, say) counts as one of the first ten, not for many after.
    estimate = measured(2.0, *[0.05] * 9)
    assert estimate.mean == pytest.approx((2.0 + 9 * 0.05) / 10)


def test_steady_calls_are_bounded_close_to_their_time() -> None:
    estimate = measured(*[0.005, 0.006] * 50)
    assert 0.005 < estimate.mean < 0.006
    assert 0.006 < estimate.bound() < 0.01


def test_one_very_long_call_moves_the_bound_a_step_not_all_the_way() -> None:
    estimate = measured(*[0.005, 0.006] * 50)
    before = estimate.bound()
    estimate.add(30.0, 0.0)
    assert before < estimate.bound() < 2 * before
    # ... while calls that really became slower move it there within a few calls.
    for _ in range(30):
        estimate.add(1.0, 0.0)
    assert estimate.mean > 0.5


def test_the_estimate_is_trusted_once_measured_while_calls_are_in_or_were_answered_lately() -> None:
    estimate = CallTime()
    assert not estimate.trusted(calls_in_pool=3, now=0.0)
    estimate.add(0.1, 100.0)
    assert estimate.trusted(calls_in_pool=1, now=500.0)
    assert estimate.trusted(calls_in_pool=0, now=100.5)
    assert not estimate.trusted(calls_in_pool=0, now=101.5)
