"""Members holding a peer out as lost before its lease lapses (job/suspicion.py), and what the
leader's plan does with it (job/plan.py). Pure: tables, no I/O."""

from __future__ import annotations

from dataclasses import replace

import pytest

from nodeagent.job import suspicion
from nodeagent.job.plan import LeaderMemory, Plan, plan
from nodeagent.model.job import ClusterView, JobRecord, NodeReport
from nodeagent.model.tiers import CheckpointRecord, Held, TierReport
from nodeagent.state import JobState, NodeState
from tests.helpers.factories import PLAN_POLICY as POLICY
from tests.helpers.factories import make_record

NOW = 1_000_000


def node(name: str, state: NodeState, acked: int = 0, **kw: object) -> NodeReport:
    return NodeReport(
        name=name,
        address="10.0.0.1",
        state=state,
        acked_generation=acked,
        lease_ttl_ms=5000,
        **kw,  # type: ignore[arg-type]
    )


def record(state: JobState, generation: int, members: tuple[str, ...], **kw: object) -> JobRecord:
    defaults = {"min_nodes": 2, "nproc_per_node": 2, "max_restarts": 2, "since_ms": NOW - 10}
    return make_record(state, generation, members, **{**defaults, **kw})


def running(generation: int, members: tuple[str, ...] = ("a", "b", "c")) -> JobRecord:
    return record(JobState.RUNNING, generation, members, master_addr="10.0.0.1", master_port=29000)


def run(rec: JobRecord, *nodes: NodeReport) -> Plan:
    view = ClusterView(now_ms=NOW, record=rec, nodes={n.name: n for n in nodes})
    return plan(view, POLICY, LeaderMemory(frozenset(n.name for n in nodes), 0))


MEMBERS = ("a", "b", "c", "d", "e")


def reports(
    suspects: dict[str, tuple[str, ...]], names: tuple[str, ...] = MEMBERS
) -> dict[str, NodeReport]:
    return {n: node(n, NodeState.RUNNING, suspects=suspects.get(n, ())) for n in names}


@pytest.mark.parametrize(
    ("suspects", "live", "held"),
    [
        ({}, MEMBERS, set()),
        # one watcher cut off proves nothing
        ({"a": ("e",)}, MEMBERS, set()),
        ({"a": ("e",), "b": ("e",)}, MEMBERS, set()),
        # three of five: a strict majority of the members
        ({"a": ("e",), "b": ("e",), "c": ("e",)}, MEMBERS, {"e"}),
        # the suspect's own voice does not count for or against it
        ({"a": ("e",), "b": ("e",), "e": ("e",)}, MEMBERS, set()),
        # a watcher whose lease lapsed does not vote
        ({"a": ("e",), "b": ("e",), "c": ("e",)}, ("a", "b", "d", "e"), set()),
        # a partition: {d, e} suspect the three, the three suspect {d, e}: the majority stays
        (
            {
                "a": ("d", "e"),
                "b": ("d", "e"),
                "c": ("d", "e"),
                "d": ("a", "b", "c"),
                "e": ("a", "b", "c"),
            },
            MEMBERS,
            {"d", "e"},
        ),
        # suspicions of a node that is no member count as well (one left out, still silent)
        ({"a": ("x",), "b": ("x",), "c": ("x",)}, MEMBERS, {"x"}),
    ],
)
def test_a_strict_majority_of_the_live_members_holds_a_node_out(
    suspects: dict[str, tuple[str, ...]], live: tuple[str, ...], held: set[str]
) -> None:
    assert suspicion.held_out(MEMBERS, reports(suspects, live)) == held


def test_never_so_many_that_the_majority_would_be_held_out() -> None:
    # Three of five die at once: the two left cannot hold out three (nor reach a quorum), and
    # even a quorum of votes never holds out as many as half the members.
    two_left = reports({"a": ("c", "d", "e"), "b": ("c", "d", "e")}, ("a", "b"))
    assert suspicion.held_out(MEMBERS, two_left) == frozenset()
    four = ("a", "b", "c", "d")
    votes = {"a": ("c", "d"), "b": ("c", "d"), "c": ("d",), "d": ("c",)}
    assert suspicion.held_out(four, reports(votes, four)) == frozenset()


def test_a_job_of_two_waits_for_the_lease() -> None:
    pair = ("a", "b")
    assert suspicion.held_out(pair, reports({"a": ("b",)}, pair)) == frozenset()


def test_members_watch_each_other_up_to_the_cap() -> None:
    assert suspicion.watched(("a", "b", "c"), "b") == ("a", "c")
    assert suspicion.watched(("a", "b", "c"), "x") == ()
    cap = tuple(f"n{i}" for i in range(suspicion.MAX_WATCHED))
    assert len(suspicion.watched(cap, "n0")) == suspicion.MAX_WATCHED - 1


BIG = tuple(f"n{i}" for i in range(100))  # over MAX_WATCHED: watched on a ring of RING


def big(suspects: dict[str, tuple[str, ...]], dead: frozenset[str] = frozenset()) -> frozenset[str]:
    nodes = {n: node(n, NodeState.RUNNING, suspects=suspects.get(n, ())) for n in BIG}
    return suspicion.held_out(BIG, {n: r for n, r in nodes.items() if n not in dead})


def cut(block: set[str]) -> dict[str, tuple[str, ...]]:
    """Each node's suspicions when `block` is cut off from the others (not from Redis)."""
    return {
        n: tuple(w for w in suspicion.watched(BIG, n) if (w in block) != (n in block)) for n in BIG
    }


def test_a_big_job_watches_on_a_ring_each_member_its_nearest_who_watch_it_back() -> None:
    assert suspicion.watched(BIG, "n0") == ("n96", "n97", "n98", "n99", "n1", "n2", "n3", "n4")
    for name in BIG:
        near = suspicion.watched(BIG, name)
        assert len(near) == suspicion.RING and name not in near
        assert all(name in suspicion.watched(BIG, other) for other in near)


def test_a_big_jobs_node_is_held_out_by_a_strict_majority_of_its_watchers() -> None:
    watchers = suspicion.watched(BIG, "n50")
    # killed: its lease still holds, every watcher suspects it
    assert big({w: ("n50",) for w in watchers}) == {"n50"}
    assert big({w: ("n50",) for w in watchers[:5]}) == {"n50"}
    assert big({w: ("n50",) for w in watchers[:4]}) == frozenset()  # 4 of 8: not a majority
    # the suspicions of members that do not watch it do not count
    assert big({f"n{i}": ("n50",) for i in range(10)}) == frozenset()
    assert suspicion.suspected_by("n50", BIG, {n: node(n, NodeState.RUNNING) for n in BIG}) == 0
    assert suspicion.judges(BIG) == suspicion.RING and suspicion.judges(MEMBERS) == 5


@pytest.mark.parametrize(
    ("block", "held"),
    [
        ({"n50"}, {"n50"}),  # one node cut off: it alone, not the eight it lost
        ({"n50", "n51", "n52"}, {"n50", "n51", "n52"}),
        # cut off in every other ring place (a rack, interleaved): each loses all its watchers
        ({f"n{i}" for i in range(0, 100, 10)}, {f"n{i}" for i in range(0, 100, 10)}),
        # half a node's watchers gone with it, or more: left to the leases, never the others
        ({f"n{i}" for i in range(40, 45)}, set()),
        ({f"n{i}" for i in range(40, 52)}, set()),
    ],
)
def test_a_cut_holds_out_the_few_cut_off_and_never_the_neighbours_they_lost(
    block: set[str], held: set[str]
) -> None:
    assert big(cut(block)) == held


def test_a_big_job_whose_members_all_lost_each_other_holds_nobody_out() -> None:
    """The network between the agents down, Redis still reachable: every member suspects its
    every watcher, each is held out by its own and so silenced: the leases decide."""
    assert big({n: suspicion.watched(BIG, n) for n in BIG}) == frozenset()
    # Every other node cut off: each loses half its watchers, no majority of any
    assert big(cut({f"n{i}" for i in range(0, 100, 2)})) == frozenset()


def suspected(
    name: str, state: NodeState = NodeState.RUNNING, acked: int = 0, tier: TierReport | None = None
) -> NodeReport:
    return node(name, state, acked, suspects=("c",), tier=tier)


def test_a_member_held_out_is_lost_at_once_though_its_lease_holds() -> None:
    decision = run(running(5), suspected("a"), suspected("b"), node("c", NodeState.RUNNING))
    assert decision.record is not None
    assert decision.record.state is JobState.RESTARTING
    assert decision.record.reason == "node_lost"
    assert decision.held == {"c"}
    assert decision.reap == ()  # its lease is left to lapse
    lost = [e for e in decision.events if e.type == "node_lost"]
    assert [(e.node, e.data["suspected"]) for e in lost] == [("c", 2)]
    assert "suspected lost by 2 of 3 members" in lost[0].message


def test_one_suspicion_changes_nothing() -> None:
    decision = run(
        running(5), suspected("a"), node("b", NodeState.RUNNING), node("c", NodeState.RUNNING)
    )
    assert decision.record is None
    assert decision.held == frozenset()


def test_the_next_generation_neither_waits_for_nor_chooses_a_held_out_node() -> None:
    announced = record(JobState.RESTARTING, 6, ("a", "b", "c"), reason="node_lost")
    # c has not acknowledged generation 6 (dead, or cut off): nobody waits for it
    decision = run(
        announced,
        suspected("a", NodeState.READY, acked=6),
        suspected("b", NodeState.READY, acked=6),
        node("c", NodeState.RUNNING, acked=5),
    )
    assert decision.record is not None
    assert decision.record.state is JobState.RUNNING
    assert decision.record.members == ("a", "b")
    assert not any(e.type == "node_lost" for e in decision.events)  # said once, as it was lost


def test_a_node_left_out_is_not_chosen_again_while_still_suspected() -> None:
    after = running(6, members=("a", "b"))
    watchers = (suspected("a", acked=6), suspected("b", acked=6))
    silent = node("c", NodeState.STANDBY, acked=6)
    assert run(after, *watchers, silent).record is None  # no growth back to c
    heard_again = (node("a", NodeState.RUNNING, acked=6), node("b", NodeState.RUNNING, acked=6))
    grown = run(after, *heard_again, silent).record
    assert grown is not None and grown.state is JobState.RESTARTING
    assert grown.reason == "node_joined"


def tiered(rec: JobRecord, *nodes: NodeReport) -> JobRecord | None:
    view = ClusterView(now_ms=NOW, record=rec, nodes={n.name: n for n in nodes})
    memory = LeaderMemory(frozenset(n.name for n in nodes), 0)
    return plan(view, replace(POLICY, tiers=True), memory).record


def test_a_held_out_node_is_no_restore_source() -> None:
    every = tuple(range(6))
    older = TierReport(memory=(Held(30, 6, every, 5),))
    newer = TierReport(memory=(Held(40, 6, every, 5),))
    announced = record(
        JobState.RESTARTING, 6, ("a", "b", "c"), reason="node_lost", checkpoint=CheckpointRecord()
    )
    chosen = tiered(
        announced,
        suspected("a", NodeState.READY, acked=6, tier=older),
        suspected("b", NodeState.READY, acked=6, tier=older),
        node("c", NodeState.RUNNING, acked=5, tier=newer),
    )
    assert chosen is not None and chosen.checkpoint is not None
    assert chosen.checkpoint.newest == 30
    trusted = tiered(
        announced,
        node("a", NodeState.READY, acked=6, tier=older),
        node("b", NodeState.READY, acked=6, tier=older),
        node("c", NodeState.READY, acked=6, tier=newer),
    )
    assert trusted is not None and trusted.checkpoint is not None
    assert trusted.checkpoint.newest == 40  # what c's save would have counted for


def test_the_plan_of_a_job_without_suspicions_is_unchanged() -> None:
    rec: JobRecord = running(5)
    plain = run(rec, *(node(n, NodeState.RUNNING) for n in "abc"))
    assert plain.record is None and plain.held == frozenset() and POLICY.min_nodes == 2


def test_a_node_held_out_is_lost_once_and_only_reaped_when_its_lease_lapses() -> None:
    first = run(running(5), suspected("a"), suspected("b"), node("c", NodeState.RUNNING))
    assert first.memory.held == {"c"}
    after = running(6, members=("a", "b"))
    view = ClusterView(
        now_ms=NOW,
        record=after,
        nodes={n.name: n for n in (suspected("a"), suspected("b"))},
        expired=("c",),
    )
    reaped = plan(view, POLICY, first.memory)
    assert [(e.type, e.node) for e in reaped.events] == [("node_reaped", "c")]
    assert reaped.reap == ("c",) and reaped.memory.held == frozenset()
    forgotten = plan(view, POLICY, LeaderMemory())  # a new leader remembers nothing
    assert [(e.type, e.node) for e in forgotten.events] == [("node_lost", "c")]
