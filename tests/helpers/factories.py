"""Small builders of model objects for tests."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from nodeagent.job.plan import Policy
from nodeagent.model.job import JobRecord
from nodeagent.state import JobState


def make_record(
    state: JobState, generation: int, members: tuple[str, ...] = (), **changes: Any
) -> JobRecord:
    """A job record with small defaults: target 3 of [1, 4], one process per node."""
    base = JobRecord(
        generation=generation,
        state=state,
        reason="test",
        target_nodes=3,
        min_nodes=1,
        max_nodes=4,
        nproc_per_node=1,
        max_restarts=3,
        members=members,
    )
    return replace(base, **changes)


# The leader's policy the plan's unit tests share (tests/unit/test_plan.py, test_suspicion.py).
PLAN_POLICY = Policy(
    min_nodes=2,
    max_nodes=4,
    target_nodes=3,
    nproc_per_node=2,
    max_restarts=2,
    join_settle_ms=1000,
    rendezvous_timeout_ms=60_000,
)
