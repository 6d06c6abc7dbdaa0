"""Pool nodes riding through a Redis outage. Pure.

A Redis outage lapses every pool lease as it lapses every job's lease; the first agent back
would lead the pool, find every other node's pool lease lapsed, and take their placements away:
every job in the pool stopped for nothing. A job's own protocol knows better whether its member
is lost (job/ridethrough.py: a member riding through is awaited by its job's leader, and its
record names it until the job re-forms without it). So a node whose pool lease lapsed keeps its
placement, and the shares it holds, while every job it serves still names it a member of a
running or restarting generation, for at most the ride-through after its lease lapsed; it gets
no new job meanwhile. Once its job's record drops it, or the ride-through is over, it is lost
to the pool as before.
"""

from __future__ import annotations

from collections.abc import Mapping

from nodeagent.model.job import JobRecord
from nodeagent.state import JobState

RIDING = "riding through a Redis outage (its pool lease lapsed)"
_GOING = (JobState.RUNNING, JobState.RESTARTING)


def riding(
    deadlines: Mapping[str, int],
    now_ms: int,
    placements: Mapping[str, str],
    shares: Mapping[str, Mapping[str, int]],
    records: Mapping[str, JobRecord | None],
    ride_through_ms: int,
) -> frozenset[str]:
    """The nodes whose pool leases lapsed (`deadlines`: each node's, Redis ms) that keep what
    they hold: every job they serve names them a member of a generation still going."""
    if ride_through_ms <= 0:
        return frozenset()
    found = set()
    for node, deadline in deadlines.items():
        if not deadline <= now_ms < deadline + ride_through_ms:
            continue
        jobs = set(shares.get(node, {}))
        if node in placements:
            jobs.add(placements[node])
        if jobs and all(_member(records.get(job), node) for job in jobs):
            found.add(node)
    return frozenset(found)


def _member(record: JobRecord | None, node: str) -> bool:
    return record is not None and record.state in _GOING and node in record.members
