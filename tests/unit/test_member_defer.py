"""pool/member.defers: while requests keep coming, the pool leader's round waits until it has
served twice as long as its last round took (a round then takes at most a third of a burst),
at most a cap; a cheap round waits for nothing."""

from __future__ import annotations

import pytest

from nodeagent.pool.member import DEFER_RATIO, defers


@pytest.mark.parametrize(
    ("since_s", "round_s", "cap_s", "waits"),
    [
        (0.5, 0.4, 10.0, True),  # 0.4 s rounds at 10,000 pending jobs: served 0.5 s of 0.8
        (0.8, 0.4, 10.0, False),
        (1.0, 0.4, 10.0, False),
        (0.5, 0.05, 10.0, False),  # a cheap round: one serving between rounds, as before
        (0.0, 0.0, 10.0, False),  # no round yet
        (9.0, 6.0, 10.0, True),
        (10.0, 6.0, 10.0, False),  # however long a round takes, one every cap
    ],
)
def test_a_round_waits_while_it_would_cost_more_than_a_third_of_a_burst(
    since_s: float, round_s: float, cap_s: float, waits: bool
) -> None:
    assert DEFER_RATIO == 2.0
    assert defers(since_s, round_s, cap_s) is waits
