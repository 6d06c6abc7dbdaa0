"""The slow-node judgment (job/slowness.py) as tables, and a node's windows (job/speed.py)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from nodeagent.channel.beats import Beat
from nodeagent.job.slowness import BY, Judgment, SlowMemory, SlowPolicy, judge
from nodeagent.job.speed import SpeedWatch
from nodeagent.model.job import Event, GpuInfo, GpuSummary, JobRecord, NodeReport, WorkerInfo
from nodeagent.model.speed import NodeSpeed
from nodeagent.state import JobState, NodeState
from nodeagent.supervisor.status import GroupPhase, GroupStatus
from nodeagent.supervisor.usage import CpuUsage
from tests.helpers.factories import make_record

MEMBERS = ("a", "b", "c", "d")


def _record(
    members: tuple[str, ...] = MEMBERS, generation: int = 5, **changes: object
) -> JobRecord:
    return make_record(JobState.RUNNING, generation, members, target_nodes=len(members), **changes)


def _nodes(*names: str, gpu: GpuSummary | None = None) -> dict[str, NodeReport]:
    return {
        n: NodeReport(n, "10.0.0.1", NodeState.RUNNING, lease_ttl_ms=5000, gpu=gpu) for n in names
    }


def _speeds(seq: int, busy: Mapping[str, float], step_s: float = 0.1) -> dict[str, NodeSpeed]:
    """Every node steps in `step_s` (a synchronous job); their own work differs."""
    return {
        n: NodeSpeed(n, 5, seq, 10.0, 100, step_s, busy_s=b, cpu_s=b * 0.8, delay_s=b * 0.2)
        for n, b in busy.items()
    }


def _windows(
    busy: Mapping[str, float],
    count: int,
    policy: SlowPolicy = SlowPolicy(),  # noqa: B008 (frozen: one default shared is fine)
    memory: SlowMemory | None = None,
    record: JobRecord | None = None,
    nodes: Mapping[str, NodeReport] | None = None,
) -> list[Judgment]:
    memory = memory or SlowMemory()
    record = record or _record()
    nodes = nodes if nodes is not None else _nodes(*record.members)
    found = []
    for seq in range(1, count + 1):
        judged = judge(_speeds(seq, busy), nodes, record, policy, memory, now_ms=seq * 10_000)
        memory = judged.memory
        found.append(judged)
    return found


def test_a_node_whose_own_work_is_twice_its_peers_is_named_after_three_windows() -> None:
    found = _windows({"a": 0.02, "b": 0.021, "c": 0.019, "d": 0.04}, 3)
    assert [j.events for j in found[:2]] == [(), ()]
    (event,) = found[2].events
    assert (event.type, event.node) == ("node_slow", "d")
    assert "2.00x its peers' median 20.0 ms" in event.message
    assert "waiting for one 8.0 ms" in event.message
    assert [v.node for v in found[2].put] == ["d"] and found[2].drain is None  # report


def test_nodes_that_wait_for_a_third_are_never_blamed() -> None:
    """c is throttled: a, b and d step as slowly (0.2 s), but sleep in the collective."""
    found = _windows({"a": 0.05, "b": 0.05, "c": 0.19, "d": 0.05}, 6)
    named = {e.node for j in found for e in j.events if e.type == "node_slow"}
    assert named == {"c"}
    assert all(found[-1].ratios[n] <= 1.0 for n in "abd")  # their peers' median, or below


def test_a_job_at_one_pace_names_nobody_and_a_noisy_window_resets_the_count() -> None:
    healthy = _windows({"a": 0.02, "b": 0.024, "c": 0.018, "d": 0.022}, 20)
    assert not any(j.events for j in healthy)
    memory = SlowMemory()
    record, nodes = _record(), _nodes(*MEMBERS)
    pattern = [0.04, 0.04, 0.02, 0.04, 0.04, 0.02]  # never three in a row
    for seq, d in enumerate(pattern, 1):
        busy = {"a": 0.02, "b": 0.02, "c": 0.02, "d": d}
        judged = judge(_speeds(seq, busy), nodes, record, SlowPolicy(), memory, seq * 10_000)
        assert not judged.events
        memory = judged.memory


def test_marked_compute_is_compared_when_every_node_marks_it() -> None:
    speeds = {
        n: NodeSpeed(n, 5, 1, 10.0, 100, 0.1, busy_s=0.05, compute_s=c)
        for n, c in {"a": 0.01, "b": 0.01, "c": 0.03}.items()
    }
    judged = judge(
        speeds,
        _nodes("a", "b", "c"),
        _record(("a", "b", "c")),
        SlowPolicy(windows=1),
        SlowMemory(),
        1,
    )
    assert judged.ratios["c"] == pytest.approx(3.0)
    assert "computes 30.0 ms a step" in judged.events[0].message


def test_two_nodes_judge_each_other_and_one_alone_is_never_judged() -> None:
    pair = _windows({"a": 0.02, "b": 0.05}, 3, record=_record(("a", "b")))
    assert [e.node for e in pair[2].events] == ["b"]
    alone = _windows({"a": 0.5}, 5, record=_record(("a",)))
    assert not any(j.events or j.ratios for j in alone)


def test_only_fresh_windows_of_the_generation_and_of_members_count() -> None:
    record, nodes = _record(), _nodes(*MEMBERS, "spare")
    busy = {"a": 0.02, "b": 0.02, "c": 0.02, "d": 0.08}
    memory = SlowMemory()
    for now in range(5):  # the same window read five times: one window
        judged = judge(_speeds(1, busy), nodes, record, SlowPolicy(), memory, now)
        memory = judged.memory
    assert memory.above["d"] == 1
    old = {n: NodeSpeed(n, 4, 2, 10.0, 10, 0.1, busy_s=b) for n, b in busy.items()}
    assert judge(old, nodes, record, SlowPolicy(), memory, 9).ratios == {}
    stranger = {**_speeds(3, busy), "spare": NodeSpeed("spare", 5, 1, 10.0, 10, 0.1, busy_s=9.0)}
    assert "spare" not in judge(stranger, nodes, record, SlowPolicy(), memory, 10).ratios


def test_recovery_is_said_after_as_many_windows_below() -> None:
    slow = _windows({"a": 0.02, "b": 0.02, "c": 0.05}, 3, record=_record(("a", "b", "c")))
    memory = slow[-1].memory
    assert "c" in memory.named
    found = _windows(
        {"a": 0.02, "b": 0.02, "c": 0.021}, 3, memory=memory, record=_record(("a", "b", "c"))
    )
    assert [j.events for j in found[:2]] == [(), ()]
    (event,) = found[2].events
    assert (event.type, event.node) == ("node_recovered_speed", "c")
    assert found[2].gone == ("c",) and "c" not in found[2].memory.named


def test_replace_drains_the_slow_node_only_with_a_spare_standing_by() -> None:
    busy = {"a": 0.02, "b": 0.02, "c": 0.02, "d": 0.05}
    policy = SlowPolicy(policy="replace")
    without = _windows(busy, 4, policy)
    assert all(j.drain is None for j in without)
    assert without[2].memory.named["d"].action == "report: no spare stands by to replace it"
    with_spare = _windows(busy, 3, policy, nodes=_nodes(*MEMBERS, "e"))
    drain = with_spare[2].drain
    assert drain is not None and drain[0] == "d"
    assert drain[1].by == BY and drain[1].drain and drain[1].reason.startswith("slow: busy")
    assert with_spare[2].memory.named["d"].action.startswith("replaced by a spare")
    # a cordoned spare does not stand by
    cordoned = _nodes(*MEMBERS, "e")
    cordoned["e"] = NodeReport("e", "h", NodeState.CORDONED, lease_ttl_ms=5000)
    assert all(j.drain is None for j in _windows(busy, 3, policy, nodes=cordoned))


def test_never_more_than_one_drain_a_window() -> None:
    busy = {"a": 0.02, "b": 0.02, "c": 0.05, "d": 0.06, "e": 0.02}
    members = ("a", "b", "c", "d", "e")
    found = _windows(
        busy,
        5,
        SlowPolicy(policy="replace", window_s=10.0),
        record=_record(members),
        nodes=_nodes(*members, "s1", "s2"),
    )
    drains = [(i, j.drain[0]) for i, j in enumerate(found) if j.drain is not None]
    assert drains == [(2, "d"), (3, "c")]  # the slowest first, the next a window later


def test_exclude_keeps_min_nodes_and_only_when_fewer_nodes_step_more() -> None:
    policy = SlowPolicy(policy="exclude")
    busy = {"a": 0.02, "b": 0.02, "c": 0.02, "d": 0.04}  # 2x > 4/3: worth it
    found = _windows(busy, 3, policy)
    assert found[2].drain is not None and found[2].drain[0] == "d"
    at_min = _windows(busy, 3, policy, record=_record(min_nodes=4))
    assert at_min[2].drain is None
    assert "min_nodes is 4" in at_min[2].memory.named["d"].action
    pair = {"a": 0.02, "b": 0.035}  # 1.75x < 2/1: one node alone would step less
    small = _windows(
        pair, 3, SlowPolicy(policy="exclude", threshold=1.5), record=_record(("a", "b"))
    )
    assert small[2].drain is None
    assert "would step less" in small[2].memory.named["b"].action


def test_a_verdict_goes_with_its_node_and_a_new_generation_counts_afresh() -> None:
    found = _windows({"a": 0.02, "b": 0.02, "c": 0.05}, 3, record=_record(("a", "b", "c")))
    memory = found[-1].memory
    after = judge(
        {}, _nodes("a", "b", "e"), _record(("a", "b", "e"), generation=6), SlowPolicy(), memory, 99
    )
    assert after.gone == ("c",) and after.memory.named == {}
    assert after.memory.above == {} and after.memory.generation == 6


def test_the_why_names_a_gpu_whose_clocks_are_limited_or_low() -> None:
    gpu = GpuSummary(
        True,
        gpus=(
            GpuInfo(0, "degraded", "none", "clocks limited: HW slowdown", sm_clock_mhz=1980),
            GpuInfo(1, "ok", "none", "", sm_clock_mhz=1000, sm_clock_max_mhz=1980),
            GpuInfo(2, "ok", "none", "", sm_clock_mhz=1900, sm_clock_max_mhz=1980),
        ),
    )
    nodes = {**_nodes("a", "b"), **_nodes("c", gpu=gpu)}
    found = _windows(
        {"a": 0.02, "b": 0.02, "c": 0.05}, 3, record=_record(("a", "b", "c")), nodes=nodes
    )
    assert (
        "its GPUs: clocks limited: HW slowdown, GPU 1 SM clock 1000/1980 MHz"
        in found[2].events[0].message
    )


def _beat(step: int, compute: float | None = None) -> Beat:
    return Beat(step + 1, step, 0.0, compute)


def test_a_node_window_is_its_slowest_rank_per_step() -> None:
    usage = {11: CpuUsage(1.0, 0.0), 12: CpuUsage(1.0, 0.0)}
    watch = SpeedWatch("n", window_s=10.0, usage=lambda pid: usage.get(pid))
    group = GroupStatus(generation=3, phase=GroupPhase.RUNNING)
    workers = (WorkerInfo(0, 0, 11, "running"), WorkerInfo(1, 1, 12, "running"))
    assert watch.next_due() is None
    assert watch.tick(0.0, group, {0: _beat(10), 1: _beat(10)}, workers) is None  # begins
    assert watch.next_due() == 10.0  # the agent wakes then, not at its next heartbeat
    assert watch.tick(5.0, group, {0: _beat(30), 1: _beat(30)}, workers) is None  # not yet
    usage[11], usage[12] = CpuUsage(2.0, 0.5), CpuUsage(3.0, 2.0)  # rank 1 waited for a CPU
    speed = watch.tick(10.0, group, {0: _beat(60, 1.0), 1: _beat(60)}, workers)
    assert speed is not None
    assert (speed.node, speed.generation, speed.seq, speed.steps) == ("n", 3, 1, 50)
    assert speed.step_s == pytest.approx(0.2)
    assert (speed.cpu_s, speed.delay_s, speed.busy_s) == pytest.approx((0.04, 0.04, 0.08))
    assert speed.compute_s is None
    assert watch.next_due() == 20.0
    # a rank that restarted (another pid) is left out of the window; a new generation begins
    workers = (WorkerInfo(0, 0, 11, "running"), WorkerInfo(1, 1, 13, "running"))
    usage[11] = CpuUsage(3.0, 0.5)
    speed = watch.tick(20.0, group, {0: _beat(110, 1.0), 1: _beat(110)}, workers)
    assert speed is not None and speed.busy_s == pytest.approx(1.0 / 50)
    assert speed.compute_s is None  # rank 0 marked nothing in the window (1.0 before and after)
    later = GroupStatus(generation=4, phase=GroupPhase.RUNNING)
    assert watch.tick(40.0, later, {0: _beat(1)}, workers) is None
    assert watch.tick(45.0, GroupStatus(), {}, ()) is None
    assert watch.next_due() is None


def test_node_speed_garbage_is_refused() -> None:
    from nodeagent.errors import CorruptStateError

    good = NodeSpeed("n", 1, 1, 10.0, 5, 0.1, busy_s=0.05)
    assert NodeSpeed.from_json(good.to_json()) == good
    for bad in (
        '{"node":"n","generation":1,"seq":1,"window_s":10,"steps":0,"step_s":0.1}',
        '{"node":"n","generation":1,"seq":1,"window_s":10,"steps":5,"step_s":-1}',
        '{"node":"../x","generation":1,"seq":1,"window_s":10,"steps":5,"step_s":0.1}',
        '{"node":"n","generation":1,"seq":1,"window_s":10,"steps":5,"step_s":0.1,"busy_s":1e400}',
    ):
        with pytest.raises(CorruptStateError):
            NodeSpeed.from_json(bad)


def test_status_says_which_node_is_slow_and_why(capsys: pytest.CaptureFixture[str]) -> None:
    from nodeagent.cli.ctl.output import print_status
    from nodeagent.coord.replies import Snapshot
    from nodeagent.coord.view import Lease
    from nodeagent.model.speed import SlowVerdict
    from nodeagent.views.status import status_document

    record = _record(("a", "b"))
    leases = tuple(Lease(n, 10_000, r) for n, r in _nodes("a", "b").items())
    snapshot = Snapshot(now_ms=5_000, leader="a 1", rev=1, record=record, leases=leases)
    speeds = _speeds(4, {"a": 0.02, "b": 0.05})
    why = "busy 50.0 ms a step: 2.50x its peers' median 20.0 ms"
    slow = {"b": SlowVerdict("b", 4_000, 2.5, why, "report: no spare stands by to replace it")}
    doc = status_document(snapshot, "j", speeds, slow)
    assert doc["slow_nodes"] == ["b"]
    nodes = {n["name"]: n for n in doc["nodes"]}
    assert nodes["a"]["slow"] is None and nodes["a"]["speed"]["busy_s"] == 0.02
    assert nodes["b"]["slow"]["ratio"] == 2.5 and nodes["b"]["speed"]["generation"] == 5
    print_status(doc)
    out = capsys.readouterr().out
    assert f"SLOW (2.50x its peers): {why}; report: no spare stands by" in out
    assert out.count("SLOW") == 1


def test_the_pace_before_a_slow_node_skips_the_window_it_became_slow_in() -> None:
    """The throttle came late in window 4: its ratios still look healthy, its steps are slower
    already. The pace the goodput compares with is the healthy windows' (the fastest of them)."""
    healthy = {"a": 0.02, "b": 0.021, "c": 0.019, "d": 0.02}
    windows = [(healthy, 0.1)] * 3 + [({**healthy, "d": 0.028}, 0.25)]
    windows += [({**healthy, "d": 0.08}, 0.4)] * 3
    memory, record, nodes = SlowMemory(), _record(), _nodes(*MEMBERS)
    events: list[Event] = []
    for seq, (busy, step_s) in enumerate(windows, start=1):
        judged = judge(
            _speeds(seq, busy, step_s), nodes, record, SlowPolicy(), memory, seq * 10_000
        )
        memory = judged.memory
        events += judged.events
    (event,) = events
    assert event.node == "d" and event.data["step_s"] == 0.4
    assert event.data["pace_s"] == 0.1  # not 0.25


def test_a_slow_node_is_said_slow_since_its_first_window_above_threshold() -> None:
    """The goodput counts a slow node's cost from where its slowdown began (issue 52): the start
    of its first window above threshold, by the leader's clock, however late the judgments ran
    (here 13 s apart for windows of 10 s: windows x window would say 30 s, not 36)."""
    healthy = {"a": 0.02, "b": 0.021, "c": 0.019, "d": 0.02}
    slow = {**healthy, "d": 0.06}
    memory, record, nodes = SlowMemory(), _record(), _nodes(*MEMBERS)
    events: list[Event] = []
    windows = [(healthy, 12_000), (slow, 25_000), (slow, 38_000), (slow, 51_000)]
    for seq, (busy, now_ms) in enumerate(windows, start=1):
        judged = judge(_speeds(seq, busy), nodes, record, SlowPolicy(), memory, now_ms)
        memory = judged.memory
        events += judged.events
    (event,) = events
    # slow from the window judged at 25 s, which began 10 s before: named at 51 s
    assert event.node == "d" and event.data["began_s"] == 36.0
    assert memory.since == {"d": 15_000}
    later = judge(_speeds(5, healthy), nodes, record, SlowPolicy(), memory, 64_000)
    assert later.memory.since == {}  # below threshold: the run is over


class _Speeds:
    """The two reads a judgment makes of the job's state (JobPort's), counted."""

    def __init__(self) -> None:
        self.read = 0

    def speeds(self) -> dict[str, NodeSpeed]:
        self.read += 1
        return {}

    def slow_verdicts(self) -> dict[str, object]:
        return {}


def test_the_leaders_judgments_keep_to_a_grid_of_windows() -> None:
    """Issue 52: the next judgment was counted from when the last one ran (at the agent's next
    heartbeat after it was due), so it drifted by up to a heartbeat a window. Now it is due a
    window after the last one was due, and the agent wakes for it (next_due); only a leader a
    whole window behind starts the grid anew."""
    from typing import Any

    from nodeagent.job.slowwatch import SlowWatch
    from nodeagent.telemetry.metrics import AgentMetrics

    now = [100.0]
    store = _Speeds()

    def watch(window_s: float) -> SlowWatch:
        return SlowWatch(
            store,  # type: ignore[arg-type]
            SlowPolicy(window_s=window_s),
            AgentMetrics("j"),
            lambda: now[0],
            lambda fn, _what: fn(),
        )

    slow = watch(2.0)
    record: Any = None
    for at, judged, due in ((100.0, 1, 102.0), (101.0, 1, 102.0), (102.3, 2, 104.0)):
        now[0] = at
        slow.tick("token", record, dict, 0)
        assert (store.read, slow.next_due()) == (judged, due), at
    now[0] = 107.5  # a leader that was frozen for two windows
    slow.tick("token", record, dict, 0)
    assert (store.read, slow.next_due()) == (3, 109.5)
    assert watch(0).next_due() is None
