"""The leader's pure decisions, table by table. No I/O."""

from __future__ import annotations

from dataclasses import replace

import pytest

from nodeagent.job import repeats
from nodeagent.job.plan import LeaderMemory, Plan, backoff_ms, plan
from nodeagent.model.job import (
    ClusterView,
    Command,
    CommandType,
    Cordon,
    Failure,
    JobRecord,
    NodeReport,
    RestartReason,
)
from nodeagent.state import JobState, NodeState
from tests.helpers.factories import PLAN_POLICY as POLICY
from tests.helpers.factories import make_record

NOW = 1_000_000
SETTLED = LeaderMemory(frozenset(), 0)  # eligible set "changed" long ago -> settled once seen


def node(name: str, state: NodeState = NodeState.READY, acked: int = 0, **kw: object) -> NodeReport:
    fields: dict[str, object] = {
        "address": f"10.0.0.{ord(name[0]) - 96}",
        "free_port": 29000 + ord(name[0]),
        "acked_generation": acked,
        "lease_ttl_ms": 5000,
        **kw,
    }
    return NodeReport(name=name, state=state, **fields)  # type: ignore[arg-type]


def record(
    state: JobState, generation: int, members: tuple[str, ...] = (), **kw: object
) -> JobRecord:
    defaults = {"min_nodes": 2, "nproc_per_node": 2, "max_restarts": 2, "since_ms": NOW - 10}
    return make_record(state, generation, members, **{**defaults, **kw})


def run(
    rec: JobRecord | None,
    *nodes: NodeReport,
    expired: tuple[str, ...] = (),
    commands: tuple[Command, ...] = (),
    memory: LeaderMemory | None = None,
    now: int = NOW,
) -> Plan:
    view = ClusterView(
        now_ms=now,
        record=rec,
        nodes={n.name: n for n in nodes},
        expired=expired,
        commands=commands,
    )
    if memory is None:  # pretend the current eligible set has been stable for a long time
        memory = LeaderMemory(
            frozenset(n.name for n in nodes if n.state is not NodeState.LEAVING),
            0,
        )
    return plan(view, POLICY, memory)


def running(gen: int = 5, members: tuple[str, ...] = ("a", "b", "c"), **kw: object) -> JobRecord:
    return record(JobState.RUNNING, gen, members, master_addr="10.0.0.1", master_port=29097, **kw)


def members_running(gen: int = 5, names: str = "abc") -> list[NodeReport]:
    return [node(n, NodeState.RUNNING, acked=gen, worker_generation=gen) for n in names]


# -- forming -----------------------------------------------------------------------------------


def test_first_leader_writes_a_waiting_record() -> None:
    result = run(None, node("a"))
    assert result.record is not None
    assert result.record.state is JobState.WAITING
    assert result.record.generation == 0
    assert result.record.target_nodes == 3


def test_forms_once_min_nodes_are_present_and_settled() -> None:
    result = run(record(JobState.WAITING, 0), node("a"), node("b"))
    assert result.record is not None
    assert result.record.state is JobState.RESTARTING
    assert result.record.generation == 1
    assert [e.type for e in result.events] == ["generation_announced"]


def test_waits_for_join_settle_below_target() -> None:
    fresh = LeaderMemory(frozenset({"a"}), NOW - 100)  # "b" just appeared
    result = run(record(JobState.WAITING, 0), node("a"), node("b"), memory=fresh)
    assert result.record is None
    assert result.memory.changed_ms == NOW
    assert "waiting for nodes" in result.reason


def test_does_not_wait_to_settle_when_target_is_reached() -> None:
    fresh = LeaderMemory(frozenset(), NOW)
    result = run(record(JobState.WAITING, 0), node("a"), node("b"), node("c"), memory=fresh)
    assert result.record is not None and result.record.state is JobState.RESTARTING


def test_barrier_waits_for_every_live_node_to_acknowledge() -> None:
    rec = record(JobState.RESTARTING, 1)
    result = run(rec, node("a", acked=1), node("b", acked=0), node("c", acked=1))
    assert result.record is None
    assert result.reason == "waiting for b to stop generation < 1"


def test_barrier_complete_starts_members_in_name_order() -> None:
    rec = record(JobState.RESTARTING, 1)
    result = run(rec, node("c", acked=1), node("a", acked=1), node("b", acked=1))
    new = result.record
    assert new is not None and new.state is JobState.RUNNING
    assert new.members == ("a", "b", "c")
    assert new.world_size == 6
    assert (new.master_addr, new.master_port) == ("10.0.0.1", 29097)
    assert [e.type for e in result.events] == ["generation_started"]


def test_a_large_job_names_a_few_members_in_messages_and_64_in_events() -> None:
    names = [f"n{i:03d}" for i in range(100)]
    big = replace(POLICY, max_nodes=100, target_nodes=100)
    nodes = {n: replace(node("a", acked=1), name=n) for n in names}
    view = ClusterView(
        now_ms=NOW,
        record=record(JobState.RESTARTING, 1, max_nodes=100, target_nodes=100),
        nodes=nodes,
    )
    result = plan(view, big, LeaderMemory(frozenset(names), 0))
    assert result.record is not None and len(result.record.members) == 100
    (event,) = result.events
    assert event.message.endswith("on n000, n001, n002, n003, n004, n005, n006, n007 and 92 more")
    assert event.data["members"] == names[:64] and event.data["members_more"] == 36
    waiting = plan(
        replace(view, record=replace(result.record, state=JobState.RESTARTING, generation=2)),
        big,
        LeaderMemory(frozenset(names), 0),
    )
    assert waiting.reason == (
        "waiting for n000, n001, n002, n003, n004, n005, n006, n007 and 92 more "
        "to stop generation < 2"
    )


def test_standby_beyond_target() -> None:
    rec = record(JobState.RESTARTING, 1)
    nodes = [node(n, acked=1) for n in "abcd"]
    new = run(rec, *nodes).record
    assert new is not None and new.members == ("a", "b", "c")


def test_below_min_nodes_after_barrier_waits() -> None:
    rec = record(JobState.RESTARTING, 3, members=("a", "b", "c"))
    new = run(rec, node("a", acked=3)).record
    assert new is not None and new.state is JobState.WAITING and new.members == ()


# -- warm-ups: survivors never wait for a newcomer ------------------------------------------------


def test_a_node_whose_replacement_warms_up_is_left_out_while_the_rest_can_run() -> None:
    """In place, b's failed worker is replaced by a warm-up started outside any generation: the
    job goes on at the smaller world instead of waiting for its imports and set-up."""
    rec = record(JobState.RESTARTING, 6, members=("a", "b", "c"), target_nodes=3)
    nodes = [node("a", acked=6), node("b", acked=6, warming=1), node("c", acked=6)]
    new = run(rec, *nodes).record
    assert new is not None and new.state is JobState.RUNNING and new.members == ("a", "c")


def test_a_warming_node_is_chosen_when_the_job_cannot_run_without_it() -> None:
    rec = record(JobState.RESTARTING, 6, members=("a", "b"), target_nodes=2, min_nodes=2)
    nodes = [node("a", acked=6), node("b", acked=6, warming=2)]
    new = run(rec, *nodes).record
    assert new is not None and new.state is JobState.RUNNING and new.members == ("a", "b")


def test_a_warming_standby_is_taken_back_once_ready_and_not_before() -> None:
    rec = running(6, ("a", "c"))
    warming = node("b", NodeState.STANDBY, acked=6, warming=1)
    assert run(rec, *members_running(6, "ac"), warming).record is None
    new = run(rec, *members_running(6, "ac"), replace(warming, warming=0)).record
    assert new is not None and new.state is JobState.RESTARTING and new.reason == "node_joined"


def test_a_report_says_how_many_of_its_workers_warm_up() -> None:
    report = node("b", NodeState.STANDBY, acked=6, warming=3)
    assert NodeReport.from_json(report.to_json()).warming == 3
    assert NodeReport.from_json(node("b").to_json().replace(',"warming":0', "")).warming == 0


# -- rank stability ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("previous", "live", "target", "expected"),
    [
        (("c", "a", "b"), "abc", 3, ("c", "a", "b")),  # survivors keep their order
        (("c", "a", "b"), "ab", 3, ("a", "b")),  # a loss closes the gap, order kept
        (("c", "a"), "abcz", 4, ("c", "a", "b", "z")),  # newcomers last, by name
        (("b", "a", "c"), "abcd", 2, ("b", "a")),  # shrinking drops the last ranks
        ((), "dcba", 3, ("a", "b", "c")),
    ],
)
def test_member_order_is_stable(
    previous: tuple[str, ...], live: str, target: int, expected: tuple[str, ...]
) -> None:
    rec = record(JobState.RESTARTING, 7, members=previous, target_nodes=target)
    new = run(rec, *(node(n, acked=7) for n in live)).record
    assert new is not None and new.members == expected
    assert new.master_addr == f"10.0.0.{ord(expected[0][0]) - 96}"


# -- failures, restarts, success ----------------------------------------------------------------


def failure(gen: int, name: str = "b", rank: int = 2) -> Failure:
    return Failure(generation=gen, node=name, rank=rank, kind="signal", signal="SIGKILL")


def test_worker_failure_announces_next_generation() -> None:
    nodes = members_running(5)
    nodes[1] = replace(nodes[1], state=NodeState.FAILED, failure=failure(5))
    new = run(running(5), *nodes).record
    assert new is not None
    assert (new.state, new.generation, new.reason) == (JobState.RESTARTING, 6, "worker_failed")
    assert new.pending_failure == failure(5)
    assert new.restart_count == 0  # charged when the barrier completes


def test_a_hang_is_reported_as_such() -> None:
    nodes = members_running(5)
    hang = Failure(generation=5, node="b", rank=2, kind="hang")
    nodes[1] = replace(nodes[1], state=NodeState.FAILED, failure=hang)
    new = run(running(5), *nodes).record
    assert new is not None and new.reason == "worker_hung"
    assert new.detail == "rank 2 on b hung (no progress beat)"


def test_a_job_out_of_its_memory_is_named_so_and_charged() -> None:
    nodes = members_running(5)
    oom = Failure(
        generation=5, node="b", rank=2, kind="oom", signal="SIGKILL", memory_limit=64 << 30
    )
    nodes[1] = replace(nodes[1], state=NodeState.FAILED, failure=oom)
    new = run(running(5), *nodes).record
    assert new is not None and new.reason == "worker_oom"
    assert new.detail.startswith(
        "rank 2 on b ran out of memory (its job's limit there: 64 GiB; ask for more with "
        "mem_per_gpu or mem)"
    )
    assert RestartReason.WORKER_OOM.charged and RestartReason.WORKER_OOM.breaks_generation


def test_failure_from_an_older_generation_is_ignored() -> None:
    nodes = members_running(5)
    nodes[1] = replace(nodes[1], failure=failure(4))
    assert run(running(5), *nodes).record is None


def restarted_after(gen: int, f: Failure | None = None) -> list[NodeReport]:
    """Members a, b, c acknowledged gen; b still reports `f` (the failure it saw), if given."""
    return [node(n, acked=gen, failure=f if n == "b" else None) for n in "abc"]


def test_failure_is_charged_when_every_member_survived() -> None:
    rec = record(JobState.RESTARTING, 6, ("a", "b", "c"), pending_failure=failure(5))
    new = run(rec, *restarted_after(6, failure(5))).record
    assert new is not None and new.state is JobState.RUNNING and new.restart_count == 1


@pytest.mark.parametrize(
    ("reported", "why"),
    [
        (None, "b reports no failure: the record's pending failure was written by someone else"),
        (failure(5, rank=3), "b reports another failure"),
    ],
)
def test_a_failure_its_node_does_not_report_is_not_charged(
    reported: Failure | None, why: str
) -> None:
    rec = record(JobState.RESTARTING, 6, ("a", "b", "c"), pending_failure=failure(5))
    new = run(rec, *restarted_after(6, reported)).record
    assert new is not None and new.state is JobState.RUNNING, why
    assert new.restart_count == 0 and "not reported by b, not charged" in new.detail, why


@pytest.mark.parametrize(
    ("reporter", "forged", "why"),
    [
        ("d", failure(5, "d", 6), "d is not a member of generation 5"),
        ("b", failure(5, "b", 0), "rank 0 runs on a, not on b"),
        ("b", failure(5, "b", 4), "b runs ranks 2-3"),
    ],
)
def test_failures_of_workers_a_member_does_not_run_start_nothing(
    reporter: str, forged: Failure, why: str
) -> None:
    nodes = [*members_running(5), node("d", NodeState.STANDBY, acked=5)]
    index = "abcd".index(reporter)
    nodes[index] = replace(nodes[index], state=NodeState.FAILED, failure=forged)
    assert run(running(5), *nodes).record is None, why


def test_a_restart_count_beyond_the_budget_is_clamped() -> None:
    """A record that says 99 restarts (while the job is still going) cannot fail the job on
    the next failure: no leader writes a count past max_restarts without failing the job."""
    new = run(running(5, restart_count=99), *members_running(5)).record
    assert new is not None and new.restart_count == POLICY.max_restarts


def test_failure_caused_by_a_lost_peer_is_not_charged() -> None:
    """Decision 11: when a node dies, its peers' collectives fail too; that is node loss."""
    rec = record(JobState.RESTARTING, 6, ("a", "b", "c"), pending_failure=failure(5, "a", 0))
    new = run(rec, node("a", acked=6), node("b", acked=6)).record
    assert new is not None and new.state is JobState.RUNNING
    assert new.restart_count == 0 and new.members == ("a", "b")
    assert new.reason == "node_lost" and "after losing c: not charged" in new.detail


def test_exceeding_max_restarts_fails_the_job() -> None:
    rec = record(
        JobState.RESTARTING, 9, ("a", "b", "c"), pending_failure=failure(8), restart_count=2
    )
    result = run(rec, *restarted_after(9, failure(8)))
    new = result.record
    assert new is not None and new.state is JobState.FAILED
    assert new.restart_count == 2 and new.reason == "max_restarts exceeded"
    assert "rank 2 on b failed (signal SIGKILL)" in new.detail
    assert new.detail.endswith("; 2 restarts used")  # as `show` counts them
    assert [e.type for e in result.events] == ["job_failed"]


LIGHTNING = "ValueError: the product (1 * 3) does not match the world size (2)"


def crashed(gen: int, cause: str) -> Failure:
    return Failure(
        generation=gen, node="b", rank=2, kind="exit_code", exit_code=1, cause=cause, log="r.log"
    )


@pytest.mark.parametrize(
    ("before", "repeated"),
    [
        (f"Trainer(num_nodes=3) | {LIGHTNING}", True),  # other lines before it: the same error
        ("ValueError: another error", False),
    ],
)
def test_a_failure_that_repeats_the_one_before_says_so(before: str, repeated: bool) -> None:
    """In the record's detail (the status) and in the generation's event; and in the job's
    failure once the budget is gone."""
    nodes = members_running(5)
    nodes[1] = replace(nodes[1], state=NodeState.FAILED, failure=crashed(5, f"x | {LIGHTNING}"))
    after_a_failure = replace(running(5), detail=crashed(4, before).describe())
    result = run(after_a_failure, *nodes)
    new = result.record
    assert new is not None and new.state is JobState.RESTARTING
    assert new.detail.endswith(repeats.SAME_CAUSE) is repeated
    assert (repeats.SAME_CAUSE in result.events[0].message) is repeated
    exhausted = replace(new, restart_count=POLICY.max_restarts, generation=6)
    ended = run(exhausted, *restarted_after(6, crashed(5, f"x | {LIGHTNING}"))).record
    assert ended is not None and ended.state is JobState.FAILED
    assert (repeats.SAME_CAUSE in ended.detail) is repeated
    assert ended.detail.endswith("restarts used")


def test_failed_job_stays_failed() -> None:
    rec = record(JobState.FAILED, 9, restart_count=3)
    assert run(rec, *(node(n, acked=9) for n in "abc")).record is None


def test_all_members_succeeded() -> None:
    nodes = [node(n, NodeState.SUCCEEDED, acked=5, succeeded_generation=5) for n in "abc"]
    after_a_restart = replace(running(5), detail="rank 0 on a failed (signal SIGABRT)")
    result = run(after_a_restart, *nodes)
    assert result.record is not None and result.record.state is JobState.SUCCEEDED
    assert result.record.detail == ""  # the failure before the restart is not why it ended
    assert [e.type for e in result.events] == ["job_succeeded"]


def test_partial_success_keeps_running() -> None:
    nodes = members_running(5)
    nodes[0] = replace(nodes[0], succeeded_generation=5)
    assert run(running(5), *nodes).record is None


# -- membership changes ---------------------------------------------------------------------------


def test_lost_member_is_reaped_and_job_reforms_without_charge() -> None:
    result = run(running(5), *members_running(5, "ab"), expired=("c",))
    assert result.reap == ("c",)
    assert [e.type for e in result.events] == ["node_lost", "generation_announced"]
    new = result.record
    assert new is not None and new.reason == "node_lost" and new.restart_count == 0


@pytest.mark.parametrize(
    ("state", "reason"),
    [
        (NodeState.LEAVING, "node_left"),
        (NodeState.FENCED, "node_lost"),
        (NodeState.JOINING, "node_lost"),  # its agent restarted: its workers are gone
    ],
)
def test_member_leaving_or_fenced_reforms_at_once(state: NodeState, reason: str) -> None:
    nodes = members_running(5)
    nodes[2] = replace(nodes[2], state=state)
    new = run(running(5), *nodes).record
    assert new is not None and new.reason == reason and new.generation == 6


def test_fenced_nodes_rejoin_the_next_generation() -> None:
    """After a Redis outage every node may be fenced; they must be able to form a job again."""
    fenced = [node(n, NodeState.FENCED, acked=5, worker_generation=5) for n in "ab"]
    first = run(None, *fenced).record
    assert first is not None and first.state is JobState.RESTARTING and first.generation == 6


def test_lost_standby_only_reaps() -> None:
    result = run(running(5), *members_running(5), expired=("d",))
    assert result.record is None and result.reap == ("d",)


def test_joining_node_below_target_grows_the_job() -> None:
    rec = running(5, ("a", "b"))
    new = run(rec, *members_running(5, "ab"), node("c")).record
    assert new is not None and new.reason == "node_joined"


def test_join_waits_to_settle_when_still_below_target() -> None:
    rec = running(5, ("a", "b"), target_nodes=4)
    fresh = LeaderMemory(frozenset({"a", "b"}), NOW - 5)
    result = run(rec, *members_running(5, "ab"), node("c"), memory=fresh)
    assert result.record is None


def test_standby_at_target_does_not_reform() -> None:
    assert (
        run(running(5), *members_running(5), node("d", NodeState.STANDBY, acked=5)).record is None
    )


# -- commands -------------------------------------------------------------------------------------


def scale(n: int, entry: str = "5-0") -> Command:
    return Command(CommandType.SCALE, target=n, by="ops", id=entry)


def test_scale_up_promotes_standby() -> None:
    nodes = [*members_running(5), node("d", NodeState.STANDBY, acked=5)]
    result = run(running(5), *nodes, commands=(scale(4),))
    new = result.record
    assert new is not None and new.target_nodes == 4 and new.reason == "scale"
    assert new.command_cursor == "5-0"
    assert [e.type for e in result.events] == ["scale_requested", "generation_announced"]


def test_scale_applied_when_the_generation_starts() -> None:
    rec = record(JobState.RESTARTING, 6, ("a", "b", "c"), reason="scale", target_nodes=4)
    result = run(rec, *(node(n, acked=6) for n in "abcd"))
    assert [e.type for e in result.events] == ["generation_started", "scale_applied"]
    assert result.events[1].data["world_size"] == 8


def test_scale_down_reforms_smaller() -> None:
    new = run(running(5), *members_running(5), commands=(scale(2),)).record
    assert new is not None and new.target_nodes == 2 and new.state is JobState.RESTARTING


def test_scale_outside_bounds_is_rejected_by_the_leader_too() -> None:
    result = run(running(5), *members_running(5), commands=(scale(9),))
    assert result.record is not None
    assert result.record.target_nodes == 3 and result.record.command_cursor == "5-0"
    assert [e.type for e in result.events] == ["scale_rejected"]


def test_scale_up_without_spare_nodes_only_records_the_target() -> None:
    new = run(running(5), *members_running(5), commands=(scale(4),)).record
    assert new is not None and new.state is JobState.RUNNING and new.target_nodes == 4


def test_restart_command_starts_a_new_generation_without_charge() -> None:
    cmd = Command(CommandType.RESTART, by="ops", id="7-0")
    new = run(running(5), *members_running(5), commands=(cmd,)).record
    assert new is not None and new.reason == "operator" and new.generation == 6
    assert new.pending_failure is None


def test_stop_then_restart_of_a_failed_job_resets_restarts() -> None:
    stop = Command(CommandType.STOP, id="8-0")
    stopped = run(running(5), *members_running(5), commands=(stop,)).record
    assert stopped is not None and stopped.state is JobState.STOPPED
    failed = record(JobState.FAILED, 9, restart_count=3)
    again = run(
        failed,
        *(node(n, acked=9) for n in "abc"),
        commands=(Command(CommandType.RESTART, id="9-0"),),
    ).record
    assert again is not None and again.state is JobState.RESTARTING and again.restart_count == 0


def test_command_cursor_advances_past_unreadable_commands() -> None:
    view = ClusterView(
        now_ms=NOW,
        record=running(5),
        nodes={n.name: n for n in members_running(5)},
        command_cursor="12-0",
    )
    result = plan(view, POLICY, SETTLED)
    assert result.record is not None and result.record.command_cursor == "12-0"


# -- timeouts, continuity -------------------------------------------------------------------------


def test_rendezvous_timeout_fails_the_job() -> None:
    rec = record(JobState.WAITING, 0, since_ms=NOW - 61_000)
    new = run(rec, node("a")).record
    assert new is not None and new.state is JobState.FAILED and new.reason == "rendezvous_timeout"


def test_generation_continues_from_nodes_after_redis_lost_its_data() -> None:
    """A Redis restart without persistence must never reuse a generation number."""
    nodes = [
        node(n, NodeState.RUNNING, acked=41, worker_generation=41, restart_count=2) for n in "abc"
    ]
    first = run(None, *nodes).record
    assert first is not None and first.restart_count == 2
    # Nothing vouches for generation 41 any more: re-form, with a number never used before.
    assert first.state is JobState.RESTARTING and first.generation == 42


def test_policy_refresh_clamps_target() -> None:
    rec = running(5, target_nodes=9, max_nodes=9)
    new = run(rec, *members_running(5)).record
    assert new is not None and new.target_nodes == 4 and new.max_nodes == 4


def test_illegal_transitions_raise() -> None:
    from nodeagent.errors import IllegalTransition

    with pytest.raises(IllegalTransition):
        record(JobState.WAITING, 1).moved_to(JobState.SUCCEEDED)


# -- cordons and GPUs -----------------------------------------------------------------------------


def cordoned(name: str, state: NodeState, acked: int, by: str = "ops") -> NodeReport:
    return node(name, state, acked, cordon=Cordon(reason="maintenance", by=by))


@pytest.mark.parametrize(("by", "reason"), [("gpu", "gpu_fault"), ("alice@host", "operator")])
def test_a_draining_member_reforms_without_charge(by: str, reason: str) -> None:
    nodes = members_running(5)
    nodes[2] = replace(
        nodes[2], state=NodeState.DRAINING, cordon=Cordon(reason="XID 79", by=by, drain=True)
    )
    new = run(running(5), *nodes, node("d", NodeState.STANDBY, acked=5)).record
    assert new is not None and new.reason == reason and new.pending_failure is None


def test_cordoned_and_unfit_nodes_are_not_chosen() -> None:
    rec = record(JobState.RESTARTING, 6, ("a", "b", "c"))
    nodes = [
        node("a", acked=6),
        cordoned("b", NodeState.CORDONED, 6),
        node("c", acked=6, unfit="3 usable GPUs of 8, the job needs 8"),
        node("d", acked=6),
    ]
    new = run(rec, *nodes).record
    assert new is not None and new.members == ("a", "d")


def test_a_cordoned_member_keeps_running_until_the_next_generation() -> None:
    nodes = members_running(5)
    nodes[1] = replace(nodes[1], cordon=Cordon(reason="soon", by="ops"))
    assert run(running(5), *nodes).record is None


# -- crash-loop backoff -------------------------------------------------------------------------

BACKOFF = replace(
    POLICY,
    restart_backoff_ms=1000,
    restart_backoff_max_ms=8000,
    restart_backoff_reset_ms=60_000,
)


@pytest.mark.parametrize(
    ("streak", "initial", "expected"),
    [
        (0, 1000, 0),
        (1, 1000, 0),
        (2, 1000, 1000),
        (3, 1000, 2000),
        (4, 1000, 4000),
        (5, 1000, 8000),
        (6, 1000, 8000),
        (500, 1000, 8000),
        (5, 0, 0),
    ],
)
def test_backoff_doubles_from_the_second_failure_in_a_row_up_to_the_cap(
    streak: int, initial: int, expected: int
) -> None:
    assert backoff_ms(replace(BACKOFF, restart_backoff_ms=initial), streak) == expected


def crash_memory(streak: int, kind: str = "worker_failed") -> LeaderMemory:
    return LeaderMemory(frozenset("abc"), 0, crash_streak=streak, crash_kind=kind)


@pytest.mark.parametrize(
    ("streak", "kind", "ran_ms", "hang", "new_streak", "message"),
    [
        (0, "", 500, False, 1, None),  # a one-off crash restarts at once
        (1, "worker_failed", 500, False, 2, "waiting 1s before generation 6"),
        (3, "worker_failed", 59_000, False, 4, "waiting 4s before generation 6"),
        (3, "worker_failed", 60_000, False, 1, None),  # the generation ran for a while
        (3, "worker_failed", 500, True, 1, None),  # a hang is another kind of failure
        (6, "worker_failed", 10, False, 7, "waiting 8s before generation 6"),  # capped
    ],
)
def test_a_quick_failure_counts_into_the_crash_streak(
    streak: int, kind: str, ran_ms: int, hang: bool, new_streak: int, message: str | None
) -> None:
    f = Failure(generation=5, node="b", rank=2, kind="hang") if hang else failure(5)
    nodes = members_running(5)
    nodes[1] = replace(nodes[1], state=NodeState.FAILED, failure=f)
    view = ClusterView(
        now_ms=NOW, record=running(5, since_ms=NOW - ran_ms), nodes={n.name: n for n in nodes}
    )
    decided = plan(view, BACKOFF, crash_memory(streak, kind))
    assert decided.record is not None and decided.record.state is JobState.RESTARTING
    assert decided.memory.crash_streak == new_streak
    said = [e.message for e in decided.events if e.type == "restart_backoff"]
    if message is None:
        assert said == []
    else:
        (line,) = said
        assert line.endswith(message) and f"failure {new_streak} in a row" in line, line


@pytest.mark.parametrize(
    ("streak", "waited_ms", "starts"),
    [(1, 0, True), (2, 999, False), (2, 1000, True), (4, 3999, False), (4, 4000, True)],
)
def test_the_next_generation_starts_when_the_backoff_is_over(
    streak: int, waited_ms: int, starts: bool
) -> None:
    """The deadline is the announcement (record.since_ms, Redis time) plus the backoff."""
    rec = record(JobState.RESTARTING, 6, ("a", "b", "c"), pending_failure=failure(5), since_ms=NOW)
    view = ClusterView(
        now_ms=NOW + waited_ms,
        record=rec,
        nodes={n.name: n for n in restarted_after(6, failure(5))},
    )
    decided = plan(view, BACKOFF, crash_memory(streak))
    if starts:
        assert decided.record is not None and decided.record.state is JobState.RUNNING
        assert decided.record.restart_count == 1
    else:
        assert decided.record is None and decided.events == ()
        assert decided.reason.startswith("crash loop: generation 6 starts in")


def test_an_uncharged_failure_does_not_back_off() -> None:
    """A failure blamed on a lost node is not part of a crash loop: no wait."""
    rec = record(JobState.RESTARTING, 6, ("a", "b", "c"), pending_failure=failure(5), since_ms=NOW)
    nodes = restarted_after(6, failure(5))[:2]  # c is gone
    decided = plan(
        ClusterView(now_ms=NOW, record=rec, nodes={n.name: n for n in nodes}),
        BACKOFF,
        crash_memory(5),
    )
    assert decided.record is not None and decided.record.state is JobState.RUNNING


def test_an_operator_restart_clears_the_crash_streak() -> None:
    decided = plan(
        ClusterView(
            now_ms=NOW,
            record=record(JobState.FAILED, 9, restart_count=3),
            nodes={n.name: n for n in members_running(9)},
            commands=(Command(CommandType.RESTART, by="op"),),
        ),
        BACKOFF,
        crash_memory(4),
    )
    assert decided.record is not None and decided.record.state is JobState.RESTARTING
    assert decided.memory.crash_streak == 0


def test_a_crash_loop_is_spaced_by_the_backoff() -> None:
    """An entrypoint that fails at import: generations start 0 s, 1 s, 2 s after each failure,
    and the budget runs out on the fourth failure."""
    policy = replace(BACKOFF, max_restarts=3)
    memory = crash_memory(0, "")
    rec, now, waits = running(5, since_ms=NOW, max_restarts=3), NOW, []
    for _ in range(4):
        now += 200  # the generation fails at import, 0.2 s after it started
        gen = rec.generation
        nodes = members_running(gen)
        nodes[1] = replace(nodes[1], state=NodeState.FAILED, failure=failure(gen))
        decided = plan(ClusterView(now, rec, {n.name: n for n in nodes}), policy, memory)
        assert decided.record is not None
        rec, memory, announced = decided.record, decided.memory, now
        acked = {n.name: n for n in restarted_after(rec.generation, failure(gen))}
        while True:  # every 100 ms, until the leader starts the next generation (or fails)
            decided = plan(ClusterView(now, rec, acked), policy, memory)
            if decided.record is not None:
                break
            now += 100
        rec = decided.record
        if rec.state is JobState.FAILED:
            break
        waits.append(now - announced)
        rec = replace(rec, since_ms=now)
    assert waits == [0, 1000, 2000]
    assert rec.state is JobState.FAILED and rec.restart_count == 3


def test_no_backoff_is_announced_when_the_failure_ends_the_job() -> None:
    nodes = members_running(5)
    nodes[1] = replace(nodes[1], state=NodeState.FAILED, failure=failure(5))
    rec = running(5, since_ms=NOW - 100, restart_count=POLICY.max_restarts)
    decided = plan(ClusterView(NOW, rec, {n.name: n for n in nodes}), BACKOFF, crash_memory(3))
    assert decided.memory.crash_streak == 4
    assert [e.type for e in decided.events] == ["generation_announced"]
