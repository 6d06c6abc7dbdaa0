"""pool/jobverbs.py: the rules nodeagentctl (pool.auth none) and the pool leader share, so that
both faces refuse the same thing in the same words."""

from __future__ import annotations

import pytest

from nodeagent.pool import jobverbs

BOUNDS = "the target must be within [min_nodes, max_nodes] = [1, 6]"


@pytest.mark.parametrize(
    ("value", "target"), [("4", 4), (" +2", 5), ("-1", 2), ("+0", 3), ("1", 1), ("-2", 1)]
)
def test_a_target_is_n_or_relative_to_the_current_one(value: str, target: int) -> None:
    assert jobverbs.scale_target("llama", value, 3, 1, 6) == target


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("2.9", "scale: expected N, +N or -N, got '2.9'"),
        ("+x", "scale: expected N, +N or -N, got '+x'"),
        ("", "scale: expected N, +N or -N, got ''"),
        ("7", f"cannot scale job llama to 7: {BOUNDS}"),
        ("-3", f"cannot scale job llama to 0: {BOUNDS}"),
    ],
)
def test_a_target_that_cannot_be_says_why(value: str, why: str) -> None:
    assert jobverbs.scale_target("llama", value, 3, 1, 6) == why


def test_a_relative_target_of_garbage_is_none() -> None:
    assert jobverbs.relative_target("+2", 3) == 5
    assert jobverbs.relative_target("two", 3) is None
