"""``@abeja_runtime.batched`` on its own: what it keeps on the handler, and what it refuses."""

from __future__ import annotations

import pytest

import abeja_runtime
from abeja_runtime.batched import declared_batch


def test_the_declaration_is_kept_on_the_handler_which_is_left_as_it_is():
    def handler(requests, context):
        return [{"content": {}} for _ in requests]

    marked = abeja_runtime.batched(max_size=16, max_wait=0.002)(handler)
    assert marked is handler
    assert declared_batch(handler) == (16, 0.002)
    assert declared_batch(lambda request, context: None) is None


@pytest.mark.parametrize(
    "kwargs, said",
    [
        ({"max_size": 1}, "max_size=...) must be a whole number above 1, got 1"),
        ({"max_size": True}, "must be a whole number above 1"),
        ({"max_size": 4.0}, "must be a whole number above 1"),
        ({"max_wait": -1}, "max_wait=...) must be seconds, 0 or more, got -1"),
        ({"max_wait": float("nan")}, "must be seconds"),
    ],
)
def test_values_that_cannot_batch_are_refused_where_they_are_written(kwargs, said):
    with pytest.raises(ValueError, match=said.replace("(", r"\(").replace(")", r"\)")):
        abeja_runtime.batched(**kwargs)
