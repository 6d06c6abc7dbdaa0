"""A rank every other rank waits on (job/stalls.py): when a rank's silence is listed, when a
process counts as asleep, the leader's naming as a table, its place in the plan, and each
agent's listing on real progress files (job/watch.py's HangWatch). No I/O but the files."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from nodeagent.channel import beats
from nodeagent.channel.beats import BeatWriter
from nodeagent.errors import CorruptStateError
from nodeagent.job import stalls
from nodeagent.job.accrual import Arrivals
from nodeagent.job.plan import LeaderMemory, plan
from nodeagent.job.watch import LISTED_LAG_S, HangWatch, WorkerWatch
from nodeagent.model.job import ClusterView, JobRecord, NodeReport
from nodeagent.state import JobState, NodeState
from nodeagent.supervisor.status import Activity, GroupPhase, GroupStatus
from tests.helpers.factories import PLAN_POLICY, make_record

NOW = 1_000_000


def steps(*intervals: float) -> Arrivals:
    arrivals = Arrivals()
    for interval in intervals:
        arrivals.add(interval)
    return arrivals


def test_a_silence_is_listed_past_the_floor_and_the_ranks_own_step_times() -> None:
    assert stalls.stall_after(steps(*[0.1] * 9), 8) is None  # too few steps to judge
    assert stalls.stall_after(steps(*[0.1] * 50), 0) is None  # off
    assert stalls.stall_after(steps(*[0.1] * 50), 8) == stalls.FLOOR_S  # quick steps: the floor
    slow = stalls.stall_after(steps(*[0.4] * 50), 8)
    assert slow == pytest.approx(stalls.FLOOR_STEPS * 0.4)  # three of its steps at least
    # A rank whose steps vary (a long one now and then) is given more than a steady one.
    steady = stalls.stall_after(steps(*[0.5] * 50), 8)
    jittery = stalls.stall_after(steps(*[0.2, 0.8] * 25), 8)
    assert steady is not None and jittery is not None and jittery > steady


@pytest.mark.parametrize(
    ("at_beat", "now", "silence", "idle"),
    [
        (Activity(True, 10.0), Activity(True, 10.1), 1.0, True),  # asleep, 10% of a CPU
        (Activity(True, 10.0), Activity(True, 10.5), 1.0, False),  # busy: a save's pickling
        (Activity(True, 10.0), Activity(False, 10.0), 1.0, False),  # running, or in disk I/O
        (None, Activity(True, 10.0), 1.0, False),  # unknown at its beat
        (Activity(True, 10.0), None, 1.0, False),  # gone, or not readable
    ],
)
def test_a_process_is_idle_only_asleep_and_using_little_cpu(
    at_beat: Activity | None, now: Activity | None, silence: float, idle: bool
) -> None:
    assert stalls.idle(at_beat, now, silence) is idle


def report(
    name: str, stalled: tuple[int, ...] = (), waiting: tuple[int, ...] = (), **kw: object
) -> NodeReport:
    fields: dict[str, object] = {
        "address": f"10.0.0.{ord(name[0]) - 96}",
        "state": NodeState.RUNNING,
        "worker_generation": 3,
        "lease_ttl_ms": 5000,
        **kw,
    }
    return NodeReport(name=name, stalled=stalled, waiting=waiting, **fields)  # type: ignore[arg-type]


def running(*members: str, nproc: int = 2) -> JobRecord:
    return make_record(JobState.RUNNING, 3, members, nproc_per_node=nproc, since_ms=NOW - 10)


@pytest.mark.parametrize(
    ("reports", "named"),
    [
        # b's rank 1 asleep in its own work, every other rank waits: b is named
        ([report("a", waiting=(0, 1)), report("b", stalled=(1,), waiting=(0,))], ("b",)),
        # two stuck, on two nodes
        ([report("a", stalled=(0,), waiting=(1,)), report("b", stalled=(1,), waiting=(0,))],
         ("a", "b")),
        # a rank not listed (still stepping, or busy in its own work): nobody
        ([report("a", waiting=(0, 1)), report("b", waiting=(0,))], ()),
        # every rank waits (a collective that never returns): nobody here, hang_timeout's
        ([report("a", waiting=(0, 1)), report("b", waiting=(0, 1))], ()),
        # every rank asleep in its own work, none waiting (no compute marks): nobody
        ([report("a", stalled=(0, 1)), report("b", stalled=(0, 1))], ()),
        # a member's report of another generation, or none, or not running: nobody
        ([report("a", waiting=(0, 1)), report("b", stalled=(1,), waiting=(0,),
                                               worker_generation=2)], ()),
        ([report("a", waiting=(0, 1))], ()),
        ([report("a", waiting=(0, 1)), report("b", stalled=(1,), waiting=(0,),
                                               state=NodeState.FAILED)], ()),
        # a rank listed both ways, or one the job does not have: garbage, nobody
        ([report("a", waiting=(0, 1)), report("b", stalled=(1,), waiting=(0, 1))], ()),
        ([report("a", waiting=(0, 1)), report("b", stalled=(2,), waiting=(0, 1))], ()),
    ],
)  # fmt: skip
def test_the_leader_names_the_nodes_every_other_rank_waits_on(
    reports: list[NodeReport], named: tuple[str, ...]
) -> None:
    nodes = {r.name: r for r in reports}
    assert stalls.waited_on(running("a", "b"), nodes) == named
    restarting = running("a", "b").moved_to(JobState.RESTARTING, generation=4)
    assert stalls.waited_on(restarting, nodes) == ()


def test_the_plan_names_them_in_the_record_once_and_clears_them() -> None:
    record = running("a", "b")
    stuck = {"a": report("a", waiting=(0, 1)), "b": report("b", stalled=(1,), waiting=(0,))}

    def planned(rec: JobRecord, nodes: dict[str, NodeReport]) -> tuple[JobRecord, list[str]]:
        view = ClusterView(now_ms=NOW, record=rec, nodes=nodes)
        policy = replace(PLAN_POLICY, nproc_per_node=2, target_nodes=2)
        done = plan(view, policy, LeaderMemory(frozenset({"a", "b"}), 0))
        return done.record or rec, [e.type for e in done.events]

    named, events = planned(record, stuck)
    assert named.waited_on == ("b",) and named.generation == 3
    assert events == ["ranks_waited_on"]
    again, events = planned(named, stuck)
    assert again == named and events == []  # said once
    back = {"a": report("a"), "b": report("b")}  # stepping again
    cleared, events = planned(named, back)
    assert cleared.waited_on == () and events == []
    assert JobRecord.from_json(named.to_json()).waited_on == ("b",)


def test_a_node_report_carries_its_stalled_ranks_and_refuses_garbage() -> None:
    listed = report("a", stalled=(1,), waiting=(0, 2))
    read = NodeReport.from_json(listed.to_json())
    assert (read.stalled, read.waiting) == ((1,), (0, 2))
    assert read.digest != report("a").digest  # the leader reads it again
    for bad in ("[1, 1]", "[-1]", "[true]", '"1"', "[1.5]"):
        raw = listed.to_json().replace('"stalled":[1]', f'"stalled":{bad}')
        with pytest.raises(CorruptStateError, match="stalled"):
            NodeReport.from_json(raw)


def beating(
    tmp_path: Path, ranks: tuple[int, ...]
) -> tuple[dict[int, Path], dict[int, BeatWriter]]:
    paths = {rank: tmp_path / f"rank-{rank}.progress" for rank in ranks}
    for path in paths.values():
        beats.create(path)
    return paths, {rank: BeatWriter(path) for rank, path in paths.items()}


def test_each_node_lists_its_ranks_waiting_and_the_one_asleep_in_its_own_work(
    tmp_path: Path,
) -> None:
    """Two ranks step every 100 ms. Rank 1 stops at the top of a step, asleep; rank 0 did its
    marked compute and waits. Past the floor rank 0 is listed waiting, and rank 1, a moment
    later, asleep in its own work; a busy rank 1 (its CPU time moving) never is."""
    paths, writers = beating(tmp_path, (0, 1))
    cpu = {0: 5.0, 1: 7.0}
    asleep = {0: True, 1: True}
    watch = HangWatch(timeout_s=0, wall=lambda: 0.0, waited_phi=8)
    watch.watch(paths, now=0.0)

    def activity(rank: int) -> Activity:
        return Activity(asleep[rank], cpu[rank])

    now = 0.0
    for step in range(1, 31):
        now = step * 0.1
        for writer in writers.values():
            writer.beat(step)
        assert watch.hung(now, activity=activity) == []
    assert (watch.stalled, watch.waiting) == ((), ())
    writers[0].computed(0.02)  # step 31's forward done: the all-reduce blocks on rank 1
    watch.hung(now + 0.3, activity=activity)
    assert (watch.stalled, watch.waiting) == ((), ())  # under the floor
    watch.hung(now + stalls.FLOOR_S, activity=activity)
    assert (watch.stalled, watch.waiting) == ((), (0,))
    cpu[1] += 0.4  # rank 1 busy in its own work (a save): never listed
    watch.hung(now + stalls.FLOOR_S + LISTED_LAG_S, activity=activity)
    assert (watch.stalled, watch.waiting) == ((), (0,))
    checked = watch.next_check()
    assert checked is not None and checked > now + stalls.FLOOR_S + LISTED_LAG_S
    watch.hung(now + 2.0, activity=activity)  # asleep since, using nothing more
    assert (watch.stalled, watch.waiting) == ((1,), (0,))
    writers[1].beat(31)
    writers[0].beat(31)
    watch.hung(now + 2.1, activity=activity)
    assert (watch.stalled, watch.waiting) == ((), ())
    for writer in writers.values():
        writer.close()


def listed(watch: WorkerWatch) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return watch.stalls


def test_a_named_node_fails_its_rank_asleep_in_its_own_work_and_says_it_changed(
    tmp_path: Path,
) -> None:
    """WorkerWatch: the listing changes make an event only when a rank asleep in its own work
    comes or goes (a waiting rank's goes out in the report alone); named by the leader, the
    node fails that rank as hung, with its stacks."""
    paths, writers = beating(tmp_path, (0, 1))
    watch = WorkerWatch("b", 0, None, waited_phi=8)
    group = GroupStatus(phase=GroupPhase.RUNNING, generation=3)
    watch._hangs._wall = lambda: 0.0
    watch._hangs.watch(paths, now=0.0)
    idle = {0: Activity(True, 1.0), 1: Activity(True, 2.0)}
    now = 0.0
    for step in range(1, 31):
        now = step * 0.1
        for writer in writers.values():
            writer.beat(step)
        watch.check(now, group, None, str, activity=idle.get)
    assert watch.named(group, str).fail is None  # nothing listed: nothing to fail
    writers[0].computed(0.02)
    found = watch.check(now + stalls.FLOOR_S, group, None, str, activity=idle.get)
    assert found.relisted and found.events == [] and listed(watch) == ((), (0,))
    found = watch.check(now + 1.5, group, None, str, activity=idle.get)
    assert found.relisted and [e.type for e in found.events] == ["ranks_stalled"]
    assert listed(watch) == ((1,), (0,))
    named = watch.named(group, lambda rank: f"stacks of {rank}")
    assert named.fail is not None and (named.fail.local_rank, named.fail.kind) == (1, "hang")
    (event,) = named.events
    assert event.type == "worker_hung" and event.data["waited_on"] is True
    assert event.data["stacks"] == "stacks of 1"
    for writer in writers.values():
        writer.close()
