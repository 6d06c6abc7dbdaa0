"""Pool nodes riding through a Redis outage (pool/riders.py): which lapsed nodes keep what
they hold. Pure, as a table."""

from __future__ import annotations

import pytest

from nodeagent.model.job import JobRecord
from nodeagent.pool.riders import riding
from nodeagent.state import JobState
from tests.helpers.factories import make_record

NOW = 1_000_000
RIDE = 60_000


def rec(state: JobState = JobState.RUNNING, members: tuple[str, ...] = ("n1", "n2")) -> JobRecord:
    return make_record(state, 4, members)


@pytest.mark.parametrize(
    ("deadlines", "placements", "shares", "records", "expected"),
    [
        ({"n1": NOW - 1000}, {"n1": "j"}, {}, {"j": rec()}, {"n1"}),
        ({"n1": NOW + 1000}, {"n1": "j"}, {}, {"j": rec()}, set()),  # its lease holds
        ({"n1": NOW - RIDE}, {"n1": "j"}, {}, {"j": rec()}, set()),  # the ride is over
        ({"n1": NOW - 1000}, {}, {}, {"j": rec()}, set()),  # it holds nothing
        ({"n1": NOW - 1000}, {"n1": "j"}, {}, {"j": rec(members=("n2",))}, set()),  # dropped
        ({"n1": NOW - 1000}, {"n1": "j"}, {}, {"j": rec(JobState.RESTARTING)}, {"n1"}),
        ({"n1": NOW - 1000}, {"n1": "j"}, {}, {"j": rec(JobState.SUCCEEDED)}, set()),
        ({"n1": NOW - 1000}, {"n1": "j"}, {}, {}, set()),  # no record (yet)
        ({"n1": NOW - 1000}, {}, {"n1": {"j": 1, "k": 2}}, {"j": rec(), "k": rec()}, {"n1"}),
        # one of the jobs sharing it no longer counts it: it is lost to the pool as before
        (
            {"n1": NOW - 1000},
            {},
            {"n1": {"j": 1, "k": 2}},
            {"j": rec(), "k": rec(members=())},
            set(),
        ),
    ],
)
def test_a_lapsed_node_keeps_its_jobs_while_each_still_counts_it(
    deadlines: dict[str, int],
    placements: dict[str, str],
    shares: dict[str, dict[str, int]],
    records: dict[str, JobRecord | None],
    expected: set[str],
) -> None:
    assert riding(deadlines, NOW, placements, shares, records, RIDE) == expected


def test_no_ride_through_no_rider() -> None:
    assert riding({"n1": NOW - 1}, NOW, {"n1": "j"}, {}, {"j": rec()}, 0) == frozenset()
