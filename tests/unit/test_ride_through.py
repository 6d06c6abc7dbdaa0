"""Riding through a Redis outage (job/ridethrough.py, job/riding.py): the pure rules as tables,
then real agents on simulated time (tests/helpers/agentloop.py), their store down or cut off
and their peer watches in memory. Every scenario also checks the invariant: never workers of
two generations running at once (no one is held out alive in these: nobody needs the
allowance). The same against real Redis, Sentinel and network namespaces: tests/chaos."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from nodeagent.job.lease import LeaseClock
from nodeagent.job.ridethrough import (
    Beat,
    RideView,
    Said,
    awaited,
    narrow,
    ride,
    says,
    widen,
)
from nodeagent.model.job import JobRecord, NodeReport
from nodeagent.state import JobState, NodeState
from nodeagent.supervisor.status import GroupPhase, GroupStatus
from tests.helpers.agentloop import Job, PeerNet
from tests.helpers.factories import make_record

RUNNING_G3 = GroupStatus(3, GroupPhase.RUNNING)


def record(**changes: object) -> JobRecord:
    base = make_record(generation=3, state=JobState.RUNNING, members=("a", "b", "c"))
    return replace(base, **{"ride_through_ms": 30_000, **changes})  # type: ignore[arg-type]


def view(**changes: object) -> RideView:
    heard = {"b": Beat(Said.RUNNING, 3), "c": Beat(Said.RIDING, 3)}
    base = RideView("a", 110.0, 100.0, 60.0, record(), RUNNING_G3, ("b", "c"), heard)
    return replace(base, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "on", "why"),
    [
        ({}, True, "every member heard (2) training generation 3"),
        ({"watched": (), "heard": {}}, True, "no other member"),
        ({"heard": {"b": Beat(Said.RUNNING, 3)}}, False, "c is not heard"),
        ({"heard": {"b": Beat(Said.STOPPING, 3), "c": Beat(Said.RUNNING, 3)}}, False, "STOPPING"),
        (
            {"heard": {"b": Beat(Said.RUNNING, 4), "c": Beat(Said.RUNNING, 3)}},
            False,
            "generation 4",
        ),
        ({"heard": {"b": Beat(Said.UNKNOWN, 0), "c": Beat(Said.RUNNING, 3)}}, False, "UNKNOWN"),
        ({"group": GroupStatus(3, GroupPhase.STOPPING)}, False, "do not run generation 3"),
        ({"group": GroupStatus(2, GroupPhase.RUNNING)}, False, "do not run generation 3"),
        ({"record": record(state=JobState.RESTARTING)}, False, "not a member of a running"),
        ({"record": record(members=("b", "c"))}, False, "not a member"),
        ({"now": 130.0}, False, "the ride is over"),  # the record's 30 s, not its own 60 s
        ({"ride_through": 0.0}, False, "off"),
        ({"record": record(ride_through_ms=0)}, False, "off"),  # written by an older leader
        ({"record": None}, False, "off"),
    ],
)
def test_a_member_rides_only_while_every_member_it_watches_trains_its_generation(
    changes: dict[str, object], on: bool, why: str
) -> None:
    verdict = ride(view(**changes))
    assert verdict.on is on and why in verdict.reason
    assert (verdict.until == 130.0) if on else verdict.until is None


@pytest.mark.parametrize(
    ("group", "acked", "riding", "beat"),
    [
        (GroupStatus(3, GroupPhase.RUNNING), 3, False, Beat(Said.RUNNING, 3)),
        (GroupStatus(3, GroupPhase.RUNNING), 3, True, Beat(Said.RIDING, 3)),
        (GroupStatus(3, GroupPhase.STOPPING), 4, False, Beat(Said.STOPPING, 3)),
        (GroupStatus(3, GroupPhase.RELEASING), 3, False, Beat(Said.STOPPING, 3)),
        (GroupStatus(3, GroupPhase.EXITED), 3, False, Beat(Said.OUT, 3)),
        (GroupStatus(3, GroupPhase.PARKED), 3, False, Beat(Said.OUT, 3)),  # left the group
        (GroupStatus(3, GroupPhase.EXITED), 4, False, Beat(Said.IDLE, 4)),
        (GroupStatus(), 2, False, Beat(Said.IDLE, 2)),
    ],
)
def test_a_beat_says_what_the_workers_do_in_their_generation(
    group: GroupStatus, acked: int, riding: bool, beat: Beat
) -> None:
    assert says(group, acked, riding) == beat


@pytest.mark.parametrize("generation", [0, 1, 65_535, 65_536, 70_000, 2**40 + 5])
def test_a_beat_s_16_bits_widen_back_to_the_generation_near_the_reader_s(generation: int) -> None:
    for near in (generation - 30_000, generation, generation + 30_000):
        assert widen(narrow(generation), near) == generation


def report(
    name: str, suspects: tuple[str, ...] = (), out: tuple[tuple[str, int], ...] = ()
) -> NodeReport:
    return NodeReport(name, "10.0.0.1", NodeState.RUNNING, suspects=suspects, peers_out=out)


NOW_MS = 1_000_000
LAPSED = {"b": NOW_MS - 1000, "c": NOW_MS - 50_000}  # b lapsed 1 s ago, c 50 s ago


@pytest.mark.parametrize(
    ("rec", "nodes", "longest", "expected"),
    [
        (record(), {"a": report("a")}, 30_000, {"b"}),  # c's longest ride is over
        (record(), {"a": report("a")}, 60_000, {"b", "c"}),
        (record(), {"a": report("a", suspects=("b",))}, 60_000, {"c"}),  # b's agent is gone
        (record(), {"a": report("a", out=(("b", 3),))}, 60_000, {"c"}),  # b's workers ended
        (record(), {"a": report("a", out=(("b", 2),))}, 60_000, {"b", "c"}),  # an older word
        (
            record(state=JobState.RESTARTING, generation=4),
            {"a": report("a", out=(("b", 3),))},
            60_000,
            {"c"},
        ),  # restarting: their workers ran the generation before
        (record(state=JobState.WAITING), {"a": report("a")}, 60_000, set()),
        (record(), {"a": report("a")}, 0, set()),  # ride-through off
        (record(members=("a", "c")), {"a": report("a")}, 60_000, {"c"}),  # b is no member
    ],
)
def test_a_leader_awaits_a_lapsed_member_until_word_that_it_stopped_or_its_ride_is_over(
    rec: JobRecord, nodes: dict[str, NodeReport], longest: int, expected: set[str]
) -> None:
    assert awaited(rec, LAPSED, nodes, NOW_MS, longest) == expected


# -- real agents on simulated time ------------------------------------------------------------


def formed(net: bool = True, **timing: object) -> Job:
    job = Job({"min_nodes": 2, "max_nodes": 3}, net=PeerNet() if net else None, timing=timing)
    for name in ("a", "b", "c"):
        job.add(name)
    job.run_until(lambda: job.running(1))
    return job


def events_of(job: Job, kind: str) -> list[str]:
    return sorted(e.node or "" for e in job.store.events if e.type == kind)


def started(job: Job) -> dict[str, list[int]]:
    return {name: w.started for name, w in job.workers.items()}


def outage(
    job: Job, seconds: float, start: Callable[[Job], None], end: Callable[[Job], None]
) -> None:
    start(job)
    job.run(seconds)
    end(job)


def test_every_member_rides_through_a_redis_outage_and_the_generation_goes_on() -> None:
    """Redis unreachable for 10 s, more than three leases: nobody fences, nobody restarts.
    When it is back the first agent to sync leads and finds the others' leases lapsed: it
    awaits them (their beats say they ride), it does not re-form around them."""
    job = formed()
    job.store.down = True
    job.run(10.0)
    assert job.workers["a"].phase is GroupPhase.RUNNING
    job.store.down = False
    job.run(5.0)
    rec = job.store.record
    assert rec is not None and rec.state is JobState.RUNNING
    assert (rec.generation, set(rec.members), rec.restart_count) == (1, {"a", "b", "c"}, 0)
    assert started(job) == {"a": [1], "b": [1], "c": [1]}
    assert events_of(job, "node_riding") == events_of(job, "node_rode_through") == ["a", "b", "c"]
    assert not events_of(job, "node_lost") and not events_of(job, "node_fenced")
    assert job.overlaps() == []


def test_an_outage_longer_than_the_ride_fences_every_member_and_the_job_re_forms() -> None:
    job = formed(ride_through="5s")
    job.store.down = True
    job.run(4.0)
    assert all(w.phase is GroupPhase.RUNNING for w in job.workers.values())  # past the lease
    job.run(3.0)  # past the ride: fenced
    assert all(w.phase is GroupPhase.EXITED for w in job.workers.values())
    job.store.down = False
    job.run_until(lambda: job.running(2))
    assert events_of(job, "node_ride_ended") == ["a", "b", "c"]
    assert job.overlaps() == []


def test_a_member_cut_off_from_redis_alone_rides_while_its_peers_hear_it() -> None:
    """b cannot reach Redis; a and c can, and hear b: b trains on, and the leader awaits it
    past its lease instead of re-forming; b's heartbeat comes back, and nothing restarted."""
    job = formed()
    job.store.cut.add("b")
    job.run(8.0)
    rec = job.store.record
    assert rec is not None and rec.generation == 1 and "b" in rec.members
    job.store.cut.clear()
    job.run(3.0)
    assert started(job) == {"a": [1], "b": [1], "c": [1]}
    assert events_of(job, "node_rode_through") == ["b"]
    assert job.overlaps() == []


def test_a_member_cut_off_from_redis_and_its_peers_fences_and_the_others_re_form() -> None:
    job = formed()
    assert job.net is not None
    job.store.cut.add("b")
    job.net.isolate("b", job.agents)
    job.run_until(lambda: job.running(2))
    rec = job.store.record
    assert rec is not None and set(rec.members) == {"a", "c"}
    job.run(1.5)  # held out by the two others at once, its lease still live: it fences at half
    assert job.workers["b"].phase is GroupPhase.EXITED and not events_of(job, "node_riding")
    job.store.cut.clear()
    job.net.cut.clear()
    job.run_until(lambda: job.running(3))
    assert job.overlaps(held_out=frozenset("b")) == []


def test_a_peer_whose_workers_end_during_the_ride_cuts_every_ride_short() -> None:
    """While Redis is down b's worker crashes: b's beats say OUT, a and c fence at once (their
    generation cannot go on). Redis back, the first to sync leads, finds the others' leases
    lapsed and heard to have stopped: the job re-forms at once (not charged: lost members)."""
    job = formed()
    job.store.down = True
    job.run(3.0)
    job.workers["b"].crash()
    job.run(1.0)
    assert all(w.phase is GroupPhase.EXITED for w in job.workers.values())
    job.store.down = False
    job.run_until(lambda: job.running(2))
    assert events_of(job, "node_ride_ended") == ["a", "b", "c"]  # sent once Redis is back
    rec = job.store.record
    assert rec is not None and set(rec.members) == {"a", "b", "c"}
    assert job.overlaps() == []


def test_a_node_lost_for_good_is_still_re_formed_around_at_its_lease() -> None:
    """b's agent is gone (frozen: its peers hear nothing): they suspect it, and the job
    re-forms without it at once, not a ride-through later."""
    job = formed()
    job.frozen.add("b")
    at = job.now
    job.run_until(lambda: job.running(2), seconds=10.0)
    assert job.now - at < 4.0  # a 3 s lease, not a 60 s ride
    rec = job.store.record
    assert rec is not None and set(rec.members) == {"a", "c"} and rec.restart_count == 0


def emptied(job: Job) -> None:
    """Redis restarted without persistence: nothing of the job left."""
    store = job.store
    store.record, store.rev, store.leader = None, 0, None
    store.leases.clear()
    store.reports.clear()
    store.events.clear()


def gone_back(job: Job) -> None:
    """A failover to a replica that lacked the last writes: the record as it was before
    generation 1 ran (announced, RESTARTING), and no lease."""
    store = job.store
    assert store.record is not None
    store.record = replace(store.record, state=JobState.RESTARTING, members=())
    store.leases.clear()
    store.leader = None


@pytest.mark.parametrize("loss", [emptied, gone_back], ids=["emptied", "an older record"])
def test_a_record_redis_lost_is_written_back_from_what_the_members_run(
    loss: Callable[[Job], None],
) -> None:
    """The members ride through, Redis comes back without the record of what they run: the
    leader waits for every rank's report and writes the generation back, RUNNING; nobody
    stopped anything."""
    job = formed()
    rec = job.store.record
    assert rec is not None
    master = (rec.members, rec.master_addr, rec.master_port)
    job.store.down = True
    job.run(5.0)
    loss(job)
    job.store.down = False
    job.run(5.0)
    now = job.store.record
    assert now is not None and (now.generation, now.state) == (1, JobState.RUNNING)
    assert (now.members, now.master_addr, now.master_port) == master
    assert now.reason == "resumed"
    assert started(job) == {"a": [1], "b": [1], "c": [1]}
    assert all(w.phase is GroupPhase.RUNNING for w in job.workers.values())
    assert job.overlaps() == []


# -- the lease's times while riding (job/lease.py) --------------------------------------------


def lease_times(clock: LeaseClock) -> object:
    """Its fence and kill points, compared to a few ULPs."""
    return pytest.approx((clock.fence_point, clock.kill_at))


def test_a_ride_moves_the_fence_and_kill_points_and_a_renewal_ends_it() -> None:
    clock = LeaseClock(4.0, None, rides=True)
    clock.renewed(100.0)
    assert lease_times(clock) == (102.0, 103.6)  # half the lease, 90 % of it
    assert clock.critical_at == 101.6  # a ride may begin from 40 %
    assert not clock.may_ride(101.5) and clock.may_ride(101.6) and clock.may_ride(102.1)
    assert not clock.may_ride(102.2)  # the keeper's own SIGTERM (55 %) may have come
    clock.ride(130.0, 101.8)
    assert lease_times(clock) == (103.8, 105.4)  # from its last tick, as from a renewal
    clock.ride(130.0, 128.0)  # ticks vouch for it up to the ride's end
    assert lease_times(clock) == (130.0, 131.6) and clock.may_ride(129.0)
    clock.renewed(131.0)
    assert not clock.riding and lease_times(clock) == (133.0, 134.6)


def test_no_ride_without_ride_through() -> None:
    clock = LeaseClock(4.0, None)
    clock.renewed(100.0)
    assert clock.critical_at == 102.0 and not clock.may_ride(102.0)


@pytest.mark.parametrize(
    ("cut_at", "unheard", "times"),
    [
        (101.9, True, (102.0, 103.6)),  # before its fence point: the lease's own times
        (102.5, True, (102.0, 103.6)),  # before the lease's own kill point: by it, no ride
        (110.0, True, (110.0, 111.6)),  # long past it: a fence point's grace from the cut
        # a peer stopped, its ride ended (it is heard: nobody counts this node lost)
        (103.5, False, (103.5, 105.1)),
        (102.5, False, (102.5, 104.1)),
    ],
)
def test_a_ride_cut_short_fences_at_once_and_kills_no_later_than_the_lease_would(
    cut_at: float, unheard: bool, times: tuple[float, float]
) -> None:
    clock = LeaseClock(4.0, None, rides=True)
    clock.renewed(100.0)
    clock.ride(130.0, cut_at - 0.1)
    clock.cut(cut_at, unheard)
    assert lease_times(clock) == times
    assert not clock.riding and not clock.may_ride(cut_at)
    assert clock.fence_due(max(cut_at, 102.0))


def test_a_ride_is_cut_short_as_unheard_only_when_a_peer_is_not_heard() -> None:
    assert ride(view(heard={"b": Beat(Said.RUNNING, 3)})).unheard
    assert not ride(view(heard={"b": Beat(Said.OUT, 3), "c": Beat(Said.RUNNING, 3)})).unheard
