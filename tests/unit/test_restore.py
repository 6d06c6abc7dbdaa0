"""The leader's restore choice (nodeagent/job/checkpoints/restore.py) and its place in plan():
tables."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from nodeagent.channel import manifests, tier
from nodeagent.checkpoint import scan
from nodeagent.errors import ConfigError, CorruptStateError
from nodeagent.job.checkpoints import restore
from nodeagent.job.plan import LeaderMemory, Policy, plan
from nodeagent.model.job import ClusterView, Failure, JobRecord, NodeReport
from nodeagent.model.spec import load_spec
from nodeagent.model.tiers import CheckpointRecord, Held, TierReport
from nodeagent.state import JobState, NodeState
from tests.helpers.factories import make_record

NPROC = 2


def node(name: str, memory: tuple[Held, ...] = (), **tier: object) -> NodeReport:
    return NodeReport(
        name=name,
        address="127.0.0.1",
        state=NodeState.READY,
        lease_ttl_ms=5000,
        tier=TierReport(memory=memory, **tier),  # type: ignore[arg-type]
    )


GEN = 7  # the generation that saved the steps held below


def held(step: int, world: int, *ranks: int, generation: int = GEN) -> Held:
    return Held(step, world, ranks, generation)


def nodes_holding(*per_node: tuple[Held, ...]) -> dict[str, NodeReport]:
    return {f"n{i}": node(f"n{i}", memory) for i, memory in enumerate(per_node)}


# Two nodes of two ranks each: world 4. Each node's tier holds its own ranks.
BOTH_AT_20 = nodes_holding(
    (held(20, 4, 0, 1), held(10, 4, 0, 1)), (held(20, 4, 2, 3), held(10, 4, 2, 3))
)


@pytest.mark.parametrize(
    ("reports", "members", "checkpoint", "order"),
    [
        (
            BOTH_AT_20,
            ("n0", "n1"),
            CheckpointRecord(),
            ("memory:20@7", "memory:10@7", "script", "start"),
        ),
        # A crash cut rank 3's save of 20: every rank still holds 10.
        (
            nodes_holding(
                (held(20, 4, 0, 1), held(10, 4, 0, 1)), (held(20, 4, 2), held(10, 4, 2, 3))
            ),
            ("n0", "n1"),
            CheckpointRecord(persisted_step=5, persisted_world=4),
            ("memory:10@7", "persistent:5@0", "script", "start"),
        ),
        # The nodes swapped places: each holds the other's ranks, nothing in memory will do.
        (
            BOTH_AT_20,
            ("n1", "n0"),
            CheckpointRecord(persisted_step=10, persisted_world=4),
            ("persistent:10@0", "script", "start"),
        ),
        # Another world (a node lost): only the persistent tier reshards.
        (
            BOTH_AT_20,
            ("n0",),
            CheckpointRecord(persisted_step=10, persisted_world=4),
            ("persistent:10@0", "script", "start"),
        ),
        # The persisted step newer than anything in memory goes first; bad steps never.
        (
            BOTH_AT_20,
            ("n0", "n1"),
            CheckpointRecord(persisted_step=30, persisted_world=4, bad=(20,)),
            ("persistent:30@0", "memory:10@7", "script", "start"),
        ),
        (
            BOTH_AT_20,
            ("n0", "n1"),
            CheckpointRecord(persisted_step=20, persisted_world=4),
            ("memory:20@7", "persistent:20@0", "memory:10@7", "script", "start"),
        ),
        ({}, ("n0",), CheckpointRecord(), ("script", "start")),
    ],
    ids=["same world", "cut save", "swapped", "other world", "persisted newer, bad", "tie", "none"],
)
def test_the_restore_order(
    reports: dict[str, NodeReport],
    members: tuple[str, ...],
    checkpoint: CheckpointRecord,
    order: tuple[str, ...],
) -> None:
    chosen = restore.choose(checkpoint, members, NPROC, reports)
    assert chosen.restore == order
    assert chosen.newest == max(20 if reports else 0, checkpoint.persisted_step or 0)


def test_a_step_is_persisted_once_every_rank_is_and_refused_steps_turn_bad() -> None:
    reports = {
        "a": node("a", persisted=(held(30, 4, 0, 1), held(40, 4, 0, 1))),
        "b": node("b", persisted=(held(30, 4, 2, 3), held(40, 4, 2)), refused=(25,)),
    }
    folded = restore.fold(CheckpointRecord(persisted_step=20, persisted_world=4), reports)
    assert (folded.persisted_step, folded.persisted_world, folded.bad) == (30, 4, (25,))
    # Once recorded it stays, even when the nodes that copied it are gone.
    assert restore.fold(folded, {}).persisted_step == 30


def record(checkpoint: CheckpointRecord, members: tuple[str, ...] = ("n0", "n1")) -> JobRecord:
    return JobRecord(
        generation=3,
        state=JobState.RUNNING,
        reason="worker_failed",
        target_nodes=2,
        min_nodes=1,
        max_nodes=2,
        nproc_per_node=NPROC,
        max_restarts=5,
        members=members,
        checkpoint=checkpoint,
    )


def test_generations_in_a_row_that_failed_before_a_newer_save_make_its_step_bad() -> None:
    """Issue 41: a failure soon after a restore (a burst: a worker killed a second after the
    survivors of a node loss restored; a bad host crashing the job twice) makes the step
    suspect, not bad; only the third generation in a row restoring it and failing before a
    newer save makes it bad (no restart loop)."""
    chosen = CheckpointRecord(restore=("memory:20@7", "memory:10@7", "script", "start"))
    once = restore.after_failure(record(chosen), BOTH_AT_20)
    assert once is not None and (once.bad, once.suspect, once.suspect_failures) == ((), 20, 1)
    twice = restore.after_failure(record(once), BOTH_AT_20)
    assert twice is not None and (twice.bad, twice.suspect_failures) == ((), 2)
    thrice = restore.after_failure(record(twice), BOTH_AT_20)
    assert thrice is not None and (thrice.bad, thrice.suspect) == ((20,), None)
    newer = nodes_holding((held(25, 4, 0, 1),), (held(25, 4, 2, 3),))
    went_on = restore.after_failure(record(twice), newer)
    assert went_on is not None and (went_on.bad, went_on.suspect_failures) == ((), 0)
    other = replace(chosen, suspect=10, suspect_failures=2)  # another step was suspect
    moved = restore.after_failure(record(other), BOTH_AT_20)
    assert moved is not None and (moved.bad, moved.suspect, moved.suspect_failures) == ((), 20, 1)
    fresh = CheckpointRecord(restore=("script", "start"))
    assert restore.after_failure(record(fresh), {}) == fresh


POLICY = Policy(
    min_nodes=1,
    max_nodes=2,
    target_nodes=2,
    nproc_per_node=NPROC,
    max_restarts=5,
    join_settle_ms=0,
    rendezvous_timeout_ms=60_000,
    tiers=True,
)


def test_plan_writes_the_restore_order_with_the_running_record_and_says_so() -> None:
    restarting = replace(
        record(CheckpointRecord(restore=("memory:10@7", "script", "start"))),
        state=JobState.RESTARTING,
        generation=4,
    )
    reports = {name: replace(report, acked_generation=4) for name, report in BOTH_AT_20.items()}
    result = plan(
        ClusterView(now_ms=1000, record=restarting, nodes=reports), POLICY, LeaderMemory()
    )
    assert result.record is not None and result.record.state is JobState.RUNNING
    assert result.record.checkpoint is not None
    assert result.record.checkpoint.restore == ("memory:20@7", "memory:10@7", "script", "start")
    [event] = [e for e in result.events if e.type == "restore_chosen"]
    assert "memory:20@7" in event.message


@pytest.mark.parametrize(("failures", "bad"), [(0, ()), (1, ()), (2, (20,))])
def test_plan_marks_the_restored_step_bad_when_three_generations_fail_at_once(
    failures: int, bad: tuple[int, ...]
) -> None:
    checkpoint = CheckpointRecord(
        restore=("memory:20@7", "script", "start"),
        suspect=20 if failures else None,
        suspect_failures=failures,
    )
    running = record(checkpoint)
    failure = Failure(generation=3, node="n1", rank=2, kind="exit_code", exit_code=1)
    reports = dict(BOTH_AT_20)
    reports["n1"] = replace(reports["n1"], failure=failure)
    result = plan(ClusterView(now_ms=1000, record=running, nodes=reports), POLICY, LeaderMemory())
    assert result.record is not None and result.record.state is JobState.RESTARTING
    assert result.record.checkpoint is not None and result.record.checkpoint.bad == bad


@pytest.mark.parametrize(
    ("tier", "said"),
    [
        (
            {"memory": [{"step": 1, "world_size": 2, "ranks": [2]}]},
            "ranks must be integers below 2",
        ),
        ({"memory": [{"step": 1, "world_size": 2, "ranks": ["0"]}]}, "ranks must be integers"),
        ({"refused": [-1]}, "refused must be a list of steps"),
        ({"persisted": [{"step": "x", "world_size": 1, "ranks": []}]}, "step"),
    ],
)
def test_a_tier_report_nodeagent_did_not_write_is_garbage(tier: object, said: str) -> None:
    raw = json.loads(node("n0").to_json())
    raw["tier"] = tier
    with pytest.raises(CorruptStateError, match=said):
        NodeReport.from_json(json.dumps(raw))


def test_a_restore_order_nodeagent_did_not_write_is_garbage() -> None:
    raw = json.loads(record(CheckpointRecord(restore=("script", "start"))).to_json())
    raw["checkpoint"]["restore"] = ["disk:1"]
    with pytest.raises(CorruptStateError, match="restore must name sources"):
        JobRecord.from_json(json.dumps(raw))


def test_a_node_never_prunes_the_step_the_leader_records_as_persisted(tmp_path: Path) -> None:
    mine = [Held(step, 2, (0,)) for step in (10, 20, 30, 40)]
    for held_step in mine:
        (tier.rank_dir(tier.step_dir(tmp_path, held_step.step), 0)).mkdir(parents=True)
    kept = scan.prune(tmp_path, mine, keep=2, protected=10)
    assert sorted(h.step for h in kept) == [10, 30, 40]
    assert tier.steps(tmp_path) == [40, 30, 10]


def test_a_submitted_job_names_no_path_the_agent_writes_as_root() -> None:
    """Its memory tier is where each node keeps them; its persistent tier is its own, written
    as its user (tests/unit/test_job_spec.py, tests/integration/test_persist_as_user.py)."""
    checkpoint = {"memory_size": "1GiB", "memory_dir": "/etc/systemd"}
    doc = {"id": "j", "entrypoint": ["python", "t.py"], "user": "alice", "checkpoint": checkpoint}
    said = "each node's decision, not a submitted job's"
    with pytest.raises(ConfigError, match=f"checkpoint.memory_dir: .*{said}"):
        load_spec(doc)
    assert load_spec({**doc, "checkpoint": {"memory_size": "1GiB"}}).job.checkpoint is not None


def test_a_step_saved_in_two_timelines_is_never_mixed() -> None:
    """n1 was cut off and kept its step 20 of generation 3; n0 saved step 20 again in
    generation 7 after the job rolled back. Same number, different saves: not offered."""
    reports = nodes_holding(
        (held(20, 4, 0, 1), held(10, 4, 0, 1)), (held(20, 4, 2, 3, generation=3), held(10, 4, 2, 3))
    )
    chosen = restore.choose(CheckpointRecord(), ("n0", "n1"), NPROC, reports)
    assert chosen.restore == ("memory:10@7", "script", "start")


def test_copies_an_earlier_agent_made_are_pruned_too_for_the_ranks_copied_now(
    tmp_path: Path,
) -> None:
    """An agent restarted knows only what it copied itself: the copies of its ranks made
    before are pruned by the same rule, another node's ranks are left alone."""
    for step in (10, 20, 30):
        for rank in (0, 1):  # rank 1 is another node's
            tier.rank_dir(tier.step_dir(tmp_path, step), rank).mkdir(parents=True)
    tier.rank_dir(tier.step_dir(tmp_path, 40), 0).mkdir(parents=True)
    mine = [Held(40, 2, (0,))]  # all this agent copied since it started
    kept = scan.prune(tmp_path, mine, keep=2, protected=10, ranks=(0,))
    assert [h.step for h in kept] == [40]
    left = {
        (step, rank)
        for step in tier.steps(tmp_path)
        for rank in (0, 1)
        if tier.rank_dir(tier.step_dir(tmp_path, step), rank).is_dir()
    }
    assert left == {(40, 0), (30, 0), (10, 0), (10, 1), (20, 1), (30, 1)}


def test_a_node_reports_the_row_counts_its_saves_record(tmp_path: Path) -> None:
    """What the leader plans fetches with (Held.rows): the manifest's dim0, the same on every
    rank; nothing where the save records none (not row-wise)."""

    def save(step: int, rank: int, dim0: tuple[int, ...] | None) -> scan.Save:
        files = {"a": manifests.FileSum(1, "0" * 64)}
        manifest = manifests.Manifest(step, 3, 2, rank, files, job="j", dim0=dim0)
        return scan.Save(tmp_path / f"{step}.{rank}", manifest)

    held = scan.held([save(20, 0, (12, 5)), save(20, 1, (12, 5)), save(10, 0, None)])
    assert [(h.step, h.ranks, h.rows) for h in held] == [(20, (0, 1), (12, 5)), (10, (0,), ())]


# -- a generation that went back behind saves held: their timeline is abandoned ------------------


def test_a_generation_that_goes_back_behind_the_newest_save_records_a_rollback() -> None:
    back = CheckpointRecord(restore=("memory:30@5", "script", "start"), newest=40)
    assert restore.rolled_back(back, 6).rollbacks == ((6, 30),)
    newest = replace(back, restore=("memory:40@5", "script", "start"))
    assert restore.rolled_back(newest, 6).rollbacks == ()
    script = replace(back, restore=("script", "start"))
    assert restore.rolled_back(script, 6).rollbacks == ()  # of no known step
    # A node held out alive may save steps of generation 5 beyond 40 until its lease fences
    # it (and copy them to its peers): the start is recorded, so that none of them counts.
    assert restore.rolled_back(newest, 6, zombies=True).rollbacks == ((6, 40),)
    late = Held(45, 4, (0, 1, 2, 3), 5)
    assert not restore.on_timeline(late, ((6, 40),))
    assert restore.on_timeline(replace(late, generation=6), ((6, 40),))


def test_saves_of_an_abandoned_timeline_are_left_out_of_every_report() -> None:
    rollbacks = ((6, 30),)  # generation 6 went back to step 30
    kept, dropped = held(30, 4, 0, 1, generation=5), held(40, 4, 0, 1, generation=5)
    again = held(40, 4, 0, 1, generation=7)  # step 40 saved again on the new timeline
    report = node("n0", (kept, dropped, again), replicas=(dropped,), persisted=(dropped,))
    assert report.tier is not None
    current = restore.current({"n0": report}, rollbacks)["n0"].tier
    assert current is not None
    assert current.memory == (kept, again)
    assert current.replicas == current.persisted == ()
    assert restore.current({"n0": report}, ()) == {"n0": report}


def test_a_node_back_with_saves_of_the_old_timeline_is_never_restored_from() -> None:
    """c was cut off at generation 5 holding step 40 whole (a and b's copies reached it); the
    job went back to 30 in generation 6 and saved 35 since. c is back for generation 8: the
    restore is the new timeline's 35, not c's 40, which no generation continues."""
    every = (0, 1, 2, 3, 4, 5)
    old = Held(40, 6, every, 5)
    new = Held(35, 6, every, 6)
    announced = make_record(
        JobState.RESTARTING,
        8,
        ("a", "b"),
        reason="node_joined",
        min_nodes=2,
        max_nodes=3,
        nproc_per_node=2,
        checkpoint=CheckpointRecord(rollbacks=((6, 30),), replicas=1),
    )
    reports = {
        "a": replace(node("a", (new,)), acked_generation=8),
        "b": replace(node("b", (new,)), acked_generation=8),
        "c": replace(node("c", (old,)), acked_generation=8),
    }
    policy = Policy(2, 3, 3, 2, 3, 0, 60_000, tiers=True, replicas=1)
    view = ClusterView(now_ms=1_000_000, record=announced, nodes=reports)
    decision = plan(view, policy, LeaderMemory(frozenset(reports), 0))
    assert decision.record is not None and decision.record.checkpoint is not None
    assert decision.record.state is JobState.RUNNING
    assert decision.record.checkpoint.restore[0] == "memory:35@6"
    assert decision.record.checkpoint.newest == 35
    forgetting = CheckpointRecord(replicas=1)
    before = plan(
        replace(view, record=replace(announced, checkpoint=forgetting)),
        policy,
        LeaderMemory(frozenset(reports), 0),
    ).record
    assert before is not None and before.checkpoint is not None
    assert before.checkpoint.restore[0] == "memory:40@5"  # what it chose without the rule


def test_rollbacks_survive_the_record_and_garbage_is_refused() -> None:
    checkpoint = CheckpointRecord(rollbacks=((6, 30), (9, 0)))
    record = make_record(JobState.RUNNING, 9, ("a",), checkpoint=checkpoint)
    assert JobRecord.from_json(record.to_json()).checkpoint == checkpoint
    data = json.loads(record.to_json())
    for garbage in ([[6]], [[6, -1]], [["6", 30]], [[6, 30.5]], [[True, 3]]):
        data["checkpoint"]["rollbacks"] = garbage
        with pytest.raises(CorruptStateError, match="rollbacks"):
            JobRecord.from_json(json.dumps(data))


def test_a_generation_formed_while_a_node_is_held_out_alive_records_its_start() -> None:
    """c is held out by a and b (suspected lost, its lease still holding): generation 6 goes on
    from 40, the newest save, and records (6, 40), so that a step 45 c's worker saves (and
    copies) in generation 5 before its lease fences it is never restored from."""
    every = (0, 1, 2, 3, 4, 5)
    at_40 = Held(40, 6, every, 5)
    announced = make_record(
        JobState.RESTARTING,
        6,
        ("a", "b", "c"),
        reason="node_lost",
        min_nodes=2,
        max_nodes=3,
        nproc_per_node=2,
        checkpoint=CheckpointRecord(replicas=1),
    )
    reports = {
        name: replace(node(name, (at_40,)), acked_generation=6, suspects=suspects)
        for name, suspects in (("a", ("c",)), ("b", ("c",)), ("c", ()))
    }
    policy = Policy(2, 3, 3, 2, 3, 0, 60_000, tiers=True, replicas=1)
    view = ClusterView(now_ms=1_000_000, record=announced, nodes=reports)
    formed = plan(view, policy, LeaderMemory(frozenset(reports), 0)).record
    assert formed is not None and formed.checkpoint is not None
    assert formed.members == ("a", "b")
    assert formed.checkpoint.restore[0] == "memory:40@5"
    assert formed.checkpoint.rollbacks == ((6, 40),)
    late = {
        **reports,
        "c": replace(reports["c"], tier=TierReport(memory=(at_40, Held(45, 6, every, 5)))),
    }
    current = restore.current(late, formed.checkpoint.rollbacks)["c"].tier
    assert current is not None and [h.step for h in current.memory] == [40]
