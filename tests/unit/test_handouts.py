"""The leader hands each node its share of the copies (job/checkpoints/handouts.py), against the
in-memory store: every member's share at a memory restore, then only what changed, all again at a
new term, after a refused write, and once a minute."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TypeVar

from nodeagent.job.checkpoints.handouts import REWRITE_S, Handouts
from nodeagent.model.job import NodeReport
from nodeagent.model.tiers import CheckpointRecord
from nodeagent.state import JobState
from tests.helpers import memstore
from tests.helpers.factories import make_record
from tests.helpers.tiers import reporting as node

T = TypeVar("T")
MEMBERS = ("a", "b", "d")


def run(fn: Callable[[], T], what: str) -> T:
    return fn()


class Recorder(memstore.MemoryJobStore):
    """The in-memory store, counting what each hand_out wrote."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.writes: list[tuple[set[str], list[str], bool]] = []

    def hand_out(
        self, leader: str, shares: Mapping[str, str], drop: Sequence[str], reset: bool
    ) -> None:
        super().hand_out(leader, shares, drop, reset)
        self.writes.append((set(shares), list(drop), reset))


def setup() -> tuple[Recorder, Handouts, list[float]]:
    store = Recorder(now_ms=lambda: 0)
    store.leader = memstore.Held("a", 1, 1 << 60)
    now = [0.0]
    return store, Handouts(store, 1, run, lambda: now[0]), now


def reports() -> dict[str, NodeReport]:
    """c is lost; a, b, d hold their rank of step 20 and their predecessor's copy (world 4)."""
    return {n: node(n, {20: [i]}, {20: [(i - 1) % 4]}) for i, n in enumerate("abcd") if n != "c"}


def test_every_member_gets_its_share_of_a_memory_restore_then_only_changes_are_written() -> None:
    store, leader, now = setup()
    checkpoint = CheckpointRecord(restore=("memory:20@1", "start"), replicas=1)
    record = make_record(JobState.RUNNING, 5, MEMBERS, checkpoint=checkpoint)
    nodes = reports()
    leader.lead("a 1", record, nodes)
    assert store.writes == [({"a", "b", "d"}, [], True)]  # a new term: the hash emptied first
    shares = {n: store.handout(n) for n in MEMBERS}
    assert all(s is not None and s.generation == 5 for s in shares.values())
    brought = {n: [t.rank for t in s.transfers if t.fetch] for n, s in shares.items() if s}
    assert brought == {"a": [1, 2], "b": [2, 3], "d": [0, 1]}
    leader.lead("a 1", record, nodes)
    assert len(store.writes) == 1  # nothing changed: nothing written
    nodes["d"] = node("d", {20: [3], 22: [3]}, {20: [2]})  # a save not whole: no new copies
    leader.lead("a 1", record, nodes)
    assert len(store.writes) == 1
    nodes["a"] = node("a", {20: [0]}, {20: [3, 2]})  # d's copy of rank 2 reached a
    leader.lead("a 1", record, nodes)
    assert store.writes[-1] == ({"d"}, [], False)  # d sends rank 2 no more: its share only
    now[0] += REWRITE_S
    leader.lead("a 1", record, nodes)
    assert store.writes[-1] == ({"a", "b", "d"}, [], False)  # every share again, once a minute


def test_a_new_term_or_a_refused_write_writes_every_share_again() -> None:
    store, leader, _ = setup()
    record = make_record(JobState.RUNNING, 5, MEMBERS, checkpoint=CheckpointRecord(replicas=1))
    nodes = {n: node(n, {20: [i]}, world=3) for i, n in enumerate(MEMBERS)}
    leader.lead("a 1", record, nodes)
    [(written, _, reset)] = store.writes
    assert written == set(MEMBERS) and reset  # each sends its rank to the next
    store.leader = memstore.Held("b", 2, 1 << 60)
    leader.lead("a 1", record, nodes)  # refused: a no longer leads
    assert len(store.writes) == 1
    store.leader = memstore.Held("a", 3, 1 << 60)
    leader.lead("a 3", record, nodes)
    assert store.writes[-1] == (set(MEMBERS), [], True)
    smaller = replace(record, generation=6, members=("a", "b"))
    two = {n: node(n, {30: [i]}, world=2) for i, n in enumerate(("a", "b"))}
    leader.lead("a 3", smaller, two)
    assert store.writes[-1] == ({"a", "b"}, ["d"], False)  # d's share goes with d


def test_nothing_is_handed_out_without_replicas_or_a_running_job() -> None:
    store = Recorder(now_ms=lambda: 0)
    store.leader = memstore.Held("a", 1, 1 << 60)
    record = make_record(JobState.RUNNING, 5, MEMBERS, checkpoint=CheckpointRecord(replicas=1))
    nodes = {n: node(n, {20: [i]}, world=3) for i, n in enumerate(MEMBERS)}
    Handouts(store, 0, run, lambda: 0.0).lead("a 1", record, nodes)
    leader = Handouts(store, 1, run, lambda: 0.0)
    leader.lead("a 1", replace(record, state=JobState.RESTARTING), nodes)
    leader.lead("a 1", replace(record, checkpoint=None), nodes)
    assert store.writes == []


def test_a_scale_down_announced_gets_shares_handing_over_to_the_nodes_that_stay() -> None:
    """a, b, d -> 1 node with one copy: b's and d's ring successors were d and a; now every
    member hands its stop save to a, the one that stays, which may take it from both. Nothing
    else is copied until the new generation runs, and a failure's restart writes nothing."""
    store, leader, _ = setup()
    checkpoint = CheckpointRecord(replicas=1)
    nodes = {n: node(n, {20: [i]}, world=3) for i, n in enumerate(MEMBERS)}
    failed = make_record(JobState.RESTARTING, 6, MEMBERS, reason="worker_failed")
    leader.lead("a 1", replace(failed, checkpoint=checkpoint), nodes)
    assert store.writes == []
    down = make_record(
        JobState.RESTARTING, 6, MEMBERS, reason="scale", target_nodes=1, checkpoint=checkpoint
    )
    leader.lead("a 1", down, nodes)
    shares = {n: store.handout(n) for n in MEMBERS}
    assert {n: s.successors for n, s in shares.items() if s} == {
        "a": (),
        "b": ("a",),
        "d": ("a",),
    }
    a = shares["a"]
    assert a is not None and a.generation == 6 and a.peers == ("b", "d")
    assert all(s is not None and s.transfers == () for s in shares.values())


def test_the_announced_shares_say_so_and_read_back() -> None:
    """A node must not take the scale-down's share for the new generation's: same number."""
    store, leader, _ = setup()
    nodes = {n: node(n, {20: [i]}, world=3) for i, n in enumerate(MEMBERS)}
    down = make_record(
        JobState.RESTARTING,
        6,
        MEMBERS,
        reason="scale",
        target_nodes=1,
        checkpoint=CheckpointRecord(replicas=1),
    )
    leader.lead("a 1", down, nodes)
    announced = store.handout("b")
    assert announced is not None and announced.announced
    running = replace(down, state=JobState.RUNNING, members=("a",))
    leader.lead("a 1", running, nodes)
    share = store.handout("a")
    assert share is not None and share.generation == 6 and not share.announced
