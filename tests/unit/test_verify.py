"""job/verify.py: what a node acts on of a record, against what its rank-0 member published.

Table-driven, no Redis: the lease reader is a dict (the integration side is test_garbage.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from nodeagent.coord.replies import NodeLease, Snapshot
from nodeagent.errors import CoordinationError
from nodeagent.job.verify import RecordCheck
from nodeagent.model.garbage import Garbage
from nodeagent.model.job import JobRecord, NodeReport
from nodeagent.state import JobState, NodeState
from tests.helpers.factories import make_record

NOW = 1_000_000
RECORD = make_record(
    JobState.RUNNING, 4, ("a", "b"), master_addr="10.0.0.1", master_port=29500, nproc_per_node=2
)
PUBLISHED = NodeReport("a", "10.0.0.1", NodeState.RUNNING, acked_generation=4, free_port=29500)


def lease(report: NodeReport | None = PUBLISHED, deadline_ms: int = NOW + 5000) -> NodeLease:
    return NodeLease("a", deadline_ms, report)


@dataclass
class Leases:
    """What a follower reads of one node's lease (None: no lease; an exception: Redis failed)."""

    held: NodeLease | Exception | None
    asked: int = 0

    def __call__(self, name: str, snapshot: Snapshot, found: list[Garbage]) -> NodeLease | None:
        self.asked += 1
        if isinstance(self.held, Exception):
            raise self.held
        return self.held


def follower(record: JobRecord | None) -> Snapshot:
    return Snapshot(now_ms=NOW, leader="a 1", rev=7, record=record, stored_record=record)


CASES = [
    # (what, the master's lease as read, local nproc, acted on as, garbage problems)
    ("a published master", lease(), 2, JobState.RUNNING, []),
    ("no lease yet: wait", None, 2, JobState.RESTARTING, []),
    ("a lapsed lease: wait", lease(deadline_ms=NOW), 2, JobState.RESTARTING, []),
    (
        "a restarted master has not acknowledged: wait",
        lease(NodeReport("a", "10.0.0.1", NodeState.JOINING, acked_generation=0)),
        2,
        JobState.RESTARTING,
        [],
    ),
    (
        "another address: forged",
        lease(NodeReport("a", "10.6.6.6", NodeState.RUNNING, acked_generation=4, free_port=1)),
        2,
        JobState.RESTARTING,
        ["record of generation 4: its master 10.0.0.1:29500 is not what a published"],
    ),
    (
        "another nproc_per_node: reported, acted on",
        lease(),
        8,
        JobState.RUNNING,
        ["record: nproc_per_node 2 is not this node's 8 (job.nproc_per_node)"],
    ),
    ("Redis cannot answer: wait", CoordinationError("down"), 2, JobState.RESTARTING, []),
]


@pytest.mark.parametrize(
    ("what", "held", "nproc", "state", "problems"), CASES, ids=[c[0] for c in CASES]
)
def test_a_follower_acts_on_a_record_only_once_its_master_is_verified(
    what: str,
    held: NodeLease | Exception | None,
    nproc: int,
    state: JobState,
    problems: list[str],
) -> None:
    check = RecordCheck("{j}:job", nproc, Leases(held))
    seen = check(follower(RECORD), "b")
    assert seen.record is not None and seen.record.state is state
    assert seen.stored_record == RECORD  # the leader plans from what is stored, as it is
    assert [g.problem.split(" (")[0] for g in seen.garbage] == [p.split(" (")[0] for p in problems]


def test_a_verified_master_is_not_read_again_until_the_generation_changes() -> None:
    leases = Leases(lease())
    check = RecordCheck("{j}:job", 2, leases)
    for _ in range(3):
        assert check(follower(RECORD), "b").record == RECORD
    assert leases.asked == 1
    check(follower(make_record(JobState.RUNNING, 5, ("a", "b"), nproc_per_node=2)), "b")
    assert leases.asked == 2


def test_the_leader_verifies_from_the_leases_it_read() -> None:
    leases = Leases(CoordinationError("never asked"))
    snapshot = Snapshot(
        now_ms=NOW, leader="b 1", rev=7, record=RECORD, stored_record=RECORD, leases=(lease(),)
    )
    assert RecordCheck("{j}:job", 2, leases)(snapshot, "b").record == RECORD
    assert leases.asked == 0


def test_no_record_and_a_record_not_running_pass_unchanged() -> None:
    check = RecordCheck("{j}:job", 2, Leases(None))
    assert check(follower(None), "b") == follower(None)
    forming = make_record(JobState.RESTARTING, 5, ("a", "b"), nproc_per_node=2)
    assert check(follower(forming), "b") == follower(forming)
