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
from nodeagent.job.watch import STALL_POLL_S, HangWatch, WorkerWatch
from nodeagent.model.job import ClusterView, Failure, JobRecord, NodeReport
from nodeagent.model.stalls import RankStall, WaitedOn
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
        (10.0, Activity(True, 10.1), 1.0, True),  # asleep, 10% of a CPU
        (10.0, Activity(True, 10.5), 1.0, False),  # busy: a save's pickling
        (10.0, Activity(False, 10.0), 1.0, False),  # a thread running, or in disk I/O
        (None, Activity(True, 10.0), 1.0, False),  # unknown at its beat
        (10.0, None, 1.0, False),  # gone, or not readable
    ],
)
def test_a_process_is_idle_only_asleep_and_using_little_cpu(
    at_beat: float | None, now: Activity | None, silence: float, idle: bool
) -> None:
    assert stalls.idle(at_beat, now, silence) is idle


def report(name: str, *stalls_: RankStall, **kw: object) -> NodeReport:
    fields: dict[str, object] = {
        "address": f"10.0.0.{ord(name[0]) - 96}",
        "state": NodeState.RUNNING,
        "worker_generation": 3,
        "lease_ttl_ms": 5000,
        **kw,
    }
    return NodeReport(name=name, stalls=stalls_, **fields)  # type: ignore[arg-type]


def running(*members: str, nproc: int = 2) -> JobRecord:
    return make_record(JobState.RUNNING, 3, members, nproc_per_node=nproc, since_ms=NOW - 10)


def waits(rank: int, step: int = 9) -> RankStall:
    """Did its part of step + 1 and waits on a peer, asleep in the collective (gloo)."""
    return RankStall(rank, step, waiting=True, asleep=True)


def own(rank: int, step: int = 9, asleep: bool = True) -> RankStall:
    """Silent in its own work: asleep (a deadlock), or busy (a save)."""
    return RankStall(rank, step, waiting=False, asleep=asleep)


A0, A1 = WaitedOn("a", 0), WaitedOn("a", 1)
B1 = WaitedOn("b", 1)


@pytest.mark.parametrize(
    ("reports", "named"),
    [
        # b's rank 1 asleep at the top of its step, every other rank waits on it
        ([report("a", waits(0), waits(1)), report("b", waits(0), own(1))], (B1,)),
        # two stuck, on two nodes
        ([report("a", own(0), waits(1)), report("b", waits(0), own(1))], (A0, B1)),
        # b's rank 1 stuck after a collective the others came back from: behind, its mark stale
        ([report("a", waits(0, 10), waits(1, 10)), report("b", waits(0, 10), waits(1, 9))],
         (B1,)),
        # behind and busy (rank 1 saving alone while the others wait): working, nobody
        ([report("a", waits(0, 10), waits(1, 10)),
          report("b", waits(0, 10), RankStall(1, 9, waiting=True, asleep=False))], ()),
        # one busy in its own work at one step: nobody
        ([report("a", waits(0), waits(1)), report("b", waits(0), own(1, asleep=False))], ()),
        # a rank not listed (still stepping): nobody
        ([report("a", waits(0), waits(1)), report("b", waits(0))], ()),
        # every rank waits at one step (a collective that never returns): hang_timeout's
        ([report("a", waits(0), waits(1)), report("b", waits(0), waits(1))], ()),
        # every rank in its own work, none waiting (no compute marks): nobody
        ([report("a", own(0), own(1)), report("b", own(0), own(1))], ()),
        # a member's report of another generation, or none, or not running: nobody
        ([report("a", waits(0), waits(1)), report("b", waits(0), own(1), worker_generation=2)],
         ()),
        ([report("a", waits(0), waits(1))], ()),
        ([report("a", waits(0), waits(1)),
          report("b", waits(0), own(1), state=NodeState.FAILED)], ()),
        # a rank listed twice, or one the job does not have: garbage, nobody
        ([report("a", waits(0), waits(1)), report("b", waits(0), own(0))], ()),
        ([report("a", waits(0), waits(1)), report("b", waits(0), own(2))], ()),
    ],
)  # fmt: skip
def test_the_leader_names_the_ranks_every_other_rank_waits_on(
    reports: list[NodeReport], named: tuple[WaitedOn, ...]
) -> None:
    nodes = {r.name: r for r in reports}
    assert stalls.waited_on(running("a", "b"), nodes) == named
    restarting = running("a", "b").moved_to(JobState.RESTARTING, generation=4)
    assert stalls.waited_on(restarting, nodes) == ()


def test_the_plan_names_them_in_the_record_once_and_clears_them() -> None:
    record = running("a", "b")
    stuck = {"a": report("a", waits(0), waits(1)), "b": report("b", waits(0), own(1))}

    def planned(rec: JobRecord, nodes: dict[str, NodeReport]) -> tuple[JobRecord, list[str]]:
        view = ClusterView(now_ms=NOW, record=rec, nodes=nodes)
        policy = replace(PLAN_POLICY, nproc_per_node=2, target_nodes=2)
        done = plan(view, policy, LeaderMemory(frozenset({"a", "b"}), 0))
        return done.record or rec, [e.type for e in done.events]

    named, events = planned(record, stuck)
    assert named.waited_on == (B1,) and named.generation == 3
    assert events == ["ranks_waited_on"]
    again, events = planned(named, stuck)
    assert again == named and events == []  # said once
    back = {"a": report("a"), "b": report("b")}  # stepping again
    cleared, events = planned(named, back)
    assert cleared.waited_on == () and events == []
    assert JobRecord.from_json(named.to_json()).waited_on == (B1,)
    head = JobRecord.from_head(named.head_json(), "b", 1)
    assert head.waited_on == (B1,)  # what the named node reads
    assert stalls.listing(stuck) and not stalls.listing(back)


def test_a_node_report_carries_its_stalled_ranks_and_refuses_garbage() -> None:
    listed = report("a", waits(0), own(1, 7, asleep=False))
    read = NodeReport.from_json(listed.to_json())
    assert read.stalls == listed.stalls
    assert read.digest != report("a").digest  # the leader reads it again
    good = '"stalls":[{"local_rank":0,'
    assert good in listed.to_json()
    for bad in (
        '"stalls":[{"local_rank":-1,',
        '"stalls":[{"local_rank":true,',
        '"stalls":[{"local_rank":"0",',
    ):
        with pytest.raises(CorruptStateError, match="local_rank"):
            NodeReport.from_json(listed.to_json().replace(good, bad))
    with pytest.raises(CorruptStateError, match="asleep"):
        NodeReport.from_json(listed.to_json().replace('"asleep":true', '"asleep":1'))


def listed(watch: HangWatch) -> tuple[RankStall, ...]:
    return watch.stalls


def beating(
    tmp_path: Path, ranks: tuple[int, ...]
) -> tuple[dict[int, Path], dict[int, BeatWriter]]:
    paths = {rank: tmp_path / f"rank-{rank}.progress" for rank in ranks}
    for path in paths.values():
        beats.create(path)
    return paths, {rank: BeatWriter(path) for rank, path in paths.items()}


def test_each_node_lists_its_ranks_silent_past_their_steps_waiting_or_not_asleep_or_not(
    tmp_path: Path,
) -> None:
    """Two ranks step every 100 ms. Rank 1 stops at the top of step 31; rank 0 did its marked
    compute and waits. Past the floor both are listed: rank 0 waiting, rank 1 in its own work,
    busy while its CPU time moves (a save), asleep once it does not."""
    paths, writers = beating(tmp_path, (0, 1))
    cpu = {0: 5.0, 1: 7.0}
    watch = HangWatch(timeout_s=0, wall=lambda: 0.0, waited_phi=8)
    watch.watch(paths, now=0.0)

    def activity(rank: int) -> Activity:
        return Activity(True, cpu[rank])

    now = 0.0
    for step in range(1, 31):
        now = step * 0.1
        for writer in writers.values():
            writer.beat(step)
        assert watch.hung(now, activity=activity, cpu=cpu.get) == []
    assert watch.stalls == ()
    writers[0].computed(0.02)  # step 31's forward done: the all-reduce blocks on rank 1
    watch.hung(now + 0.3, activity=activity, cpu=cpu.get)
    assert watch.stalls == ()  # under the floor
    due = watch.next_check()
    assert due is not None and due == pytest.approx(now + stalls.FLOOR_S)
    cpu[1] += 0.4  # rank 1 busy in its own work
    watch.hung(now + stalls.FLOOR_S, activity=activity, cpu=cpu.get)
    assert listed(watch) == (waits(0, 30), own(1, 30, asleep=False))
    assert watch.next_check() == pytest.approx(now + stalls.FLOOR_S + STALL_POLL_S)  # asleep yet?
    watch.hung(now + 2.0, activity=activity, cpu=cpu.get)  # asleep since, using nothing more
    assert listed(watch) == (waits(0, 30), own(1, 30))
    writers[1].beat(31)
    writers[0].beat(31)
    watch.hung(now + 2.1, activity=activity, cpu=cpu.get)
    assert listed(watch) == ()
    for writer in writers.values():
        writer.close()


def test_a_named_node_fails_the_rank_named_if_it_still_is_silent(tmp_path: Path) -> None:
    """WorkerWatch: a change of the listing goes out at once (no event); named by the leader,
    the node fails that rank as hung, with its stacks, and only while it is listed."""
    paths, writers = beating(tmp_path, (0, 1))
    watch = WorkerWatch("b", 0, None, waited_phi=8)
    group = GroupStatus(phase=GroupPhase.RUNNING, generation=3)
    watch._hangs._wall = lambda: 0.0
    watch._hangs.watch(paths, now=0.0)
    idle = {0: Activity(True, 1.0), 1: Activity(True, 2.0)}
    cpus = {0: 1.0, 1: 2.0}
    now = 0.0
    for step in range(1, 31):
        now = step * 0.1
        for writer in writers.values():
            writer.beat(step)
        watch.check(now, group, None, str, activity=idle.get, cpu=cpus.get)
    assert watch.named(group, 1, str).fail is None  # not listed: nothing to fail
    writers[0].computed(0.02)
    found = watch.check(now + stalls.FLOOR_S, group, None, str, activity=idle.get, cpu=cpus.get)
    assert found.relisted and found.events == [] and watch.stalls == (waits(0, 30), own(1, 30))
    assert not watch.check(
        now + stalls.FLOOR_S + 0.1, group, None, str, activity=idle.get, cpu=cpus.get
    ).anything
    named = watch.named(group, 1, lambda rank: f"stacks of {rank}")
    assert named.fail is not None and (named.fail.local_rank, named.fail.kind) == (1, "hang")
    (event,) = named.events
    assert event.type == "worker_hung" and event.data["waited_on"] is True
    assert event.data["stacks"] == "stacks of 1"
    for writer in writers.values():
        writer.close()


def test_a_group_that_does_not_run_has_no_hang_check_due(tmp_path: Path) -> None:
    """A rank that stopped beating while its group failed (a drained node's worker, stopped)
    is not checked, so no check is due: its deadline, long past, once had the agent's loop
    spinning (issue 81: a drained slow node's agent at 74 % of a CPU)."""
    paths, writers = beating(tmp_path, (0,))
    watch = WorkerWatch("b", 5.0, None)
    watch._hangs.watch(paths, now=0.0)
    writers[0].beat(1)
    running = GroupStatus(phase=GroupPhase.RUNNING, generation=3)
    watch.check(0.1, running, None, str)
    assert watch.next_check() is not None
    failed = replace(running, failure=Failure(3, "b", 0, "exit_code", 1))
    watch.check(60.0, failed, None, str)
    assert watch.next_check() is None
    watch.check(60.1, running, None, str)  # running again: due again
    assert watch.next_check() is not None
    writers[0].close()
