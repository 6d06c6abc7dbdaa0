"""Decoding script replies: leases, the master check, garbage notes. Pure, no Redis."""

from __future__ import annotations

from dataclasses import replace

import pytest

from nodeagent.coord.keys import JobKeys
from nodeagent.coord.replies import NodeLease, master_problem, parse_snapshot, read_lease
from nodeagent.model.garbage import Garbage
from nodeagent.model.job import NodeReport
from nodeagent.state import JobState, NodeState
from tests.helpers.factories import make_record

KEYS = JobKeys("p", "j")
NOW = 1_700_000_000_000
A = NodeReport(
    name="a",
    address="10.0.0.1",
    state=NodeState.READY,
    acked_generation=5,
    free_port=29500,
    lease_ttl_ms=1000,
)
RECORD = make_record(JobState.RUNNING, 5, ("a", "b"), master_addr="10.0.0.1", master_port=29500)


@pytest.mark.parametrize(
    ("name", "score", "raw", "pttl", "problem"),
    [
        ("a", str(NOW + 900), A.to_json(), 900, ""),
        ("a", str(NOW - 5), "", -2, ""),  # expired and gone: reaped, not garbage
        ("a", "inf", A.to_json(), 900, "not a time in ms"),
        ("a", "-inf", A.to_json(), 900, "not a time in ms"),
        ("a", "nan", A.to_json(), 900, "not a time in ms"),
        ("a", str(NOW + 0.5), A.to_json(), 900, "not a time in ms"),
        ("a b", str(NOW + 900), A.to_json(), 900, "not a node name"),
        ("a", str(NOW + 900), A.to_json(), -1, "no TTL"),
        ("a", str(NOW + 900), "", -2, "no node key"),
        ("a", str(NOW + 60_000), A.to_json(), 900, "beyond its node key's TTL"),
    ],
)
def test_lease_plausibility(name: str, score: str, raw: str, pttl: int, problem: str) -> None:
    found: list[Garbage] = []
    lease = read_lease(KEYS, NOW, (name, score, raw, pttl), found)
    if problem:
        assert lease is None and len(found) == 1 and problem in found[0].problem
        assert found[0].kind == "leases"
    else:
        assert lease is not None and not found


def test_a_report_under_another_name_is_garbage() -> None:
    found: list[Garbage] = []
    lease = read_lease(KEYS, NOW, ("b", str(NOW + 900), A.to_json(), 900), found)
    assert lease is not None and lease.report is None
    assert [g.kind for g in found] == ["node"] and "names a" in found[0].problem


def live(report: NodeReport | None) -> NodeLease:
    return NodeLease("a", NOW + 500, report)


@pytest.mark.parametrize(
    ("lease", "words", "forged"),
    [
        (live(A), "", False),
        (None, "holds no live lease", False),
        (NodeLease("a", NOW - 1, A), "holds no live lease", False),
        (live(None), "no readable report", False),
        (live(replace(A, acked_generation=4)), "has not acknowledged", True),
        (live(replace(A, acked_generation=0, state=NodeState.JOINING)), "not acknowledged", False),
        (live(replace(A, address="10.66.66.66")), "not what a published", True),
        (live(replace(A, free_port=1)), "not what a published", True),
    ],
)
def test_master_check(lease: NodeLease | None, words: str, forged: bool) -> None:
    problem, is_forged = master_problem(RECORD, lease, NOW)
    assert (words in problem if words else problem == "") and is_forged == forged


def reply(record: str | bool, leases: list[tuple[str, str, str, int]]) -> list[object]:
    flat = [part for name, score, _, _ in leases for part in (name, score)]
    return [
        NOW,
        "a 3",
        "7",
        record,
        False,
        NOW + 800,
        ["leases\tp:{j}:leases\tholds a set, not a zset\trebuilt"],
        flat,
        [raw for _, _, raw, _ in leases],
        [pttl for _, _, _, pttl in leases],
        [["5-0", ["command", '{"type": "scale", "target": 2.9}']], ["6-0", ["x", "y"]]],
    ]


def test_a_leader_reply_with_garbage_everywhere() -> None:
    forged = replace(RECORD, master_addr="10.66.66.66").to_json()
    snap = parse_snapshot(
        KEYS,
        reply(forged, [("a", str(NOW + 900), A.to_json(), 900), ("evil", "inf", "", -2)]),
    )
    kinds = sorted(g.kind for g in snap.garbage)
    assert kinds == ["commands", "commands", "job", "leases", "leases"], snap.garbage
    assert snap.drop == (("evil", "inf"),)
    assert snap.commands == () and snap.command_cursor == "6-0"  # the cursor moves past both
    assert snap.record is None and snap.stored_record is None and snap.record_error
    assert snap.cluster_view().record is None  # planned from as unreadable: rewritten
    assert [lease.name for lease in snap.leases] == ["a"]


def test_a_follower_reply_with_a_garbage_rev() -> None:
    snap = parse_snapshot(KEYS, [NOW, False, "abc", False, "{", False, []])
    assert snap.rev == 0 and snap.leader is None and snap.cordon is None
    assert sorted(g.kind for g in snap.garbage) == ["cordons", "job"]
