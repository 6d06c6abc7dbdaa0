"""The committed save pinned (nodeagent/channel/pin.py): the agent writes the pin from the job
record; a peer's copy, sent to a real listener on loopback, and a fetch go to the other slot
rather than over the pinned save."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from prometheus_client import CollectorRegistry

from nodeagent.channel import manifests, pin, tier
from nodeagent.channel.pin import Pin
from nodeagent.channel.restore import RestoreReport, write_report
from nodeagent.checkpoint import sender
from nodeagent.checkpoint.keeper import TierKeeper
from nodeagent.checkpoint.peerauth import Unauthenticated
from nodeagent.checkpoint.wire import Hello, Want
from nodeagent.config.settings import CheckpointConfig
from nodeagent.coord.bounded import unbounded
from nodeagent.job.checkpoints.replicaduties import ReplicaDuties
from nodeagent.job.checkpoints.tierduties import TierDuties
from nodeagent.model.handout import Handout
from nodeagent.model.tiers import CheckpointRecord, TierReport
from nodeagent.state import JobState
from nodeagent.supervisor.spec import WorkerSpec, restore_report_path
from nodeagent.supervisor.status import GroupPhase, GroupStatus
from nodeagent.telemetry.checkpoints import CheckpointMetrics
from tests.helpers.factories import make_record
from tests.helpers.tiers import CopyState, fake_save, node_replicas, terms

JOB = "j"
MEMBERS = ("a", "b")
OPEN = Unauthenticated()


def steps_held(directory: Path, rank: int) -> list[int]:
    return sorted(
        manifests.read_manifest(s).step
        for s in tier.slots(directory, rank)
        if (s / manifests.MANIFEST).exists()
    )


def test_a_peers_copy_never_goes_over_the_pinned_save(tmp_path: Path) -> None:
    """b holds a's steps 10 and 12; 10 is committed (12's other copies are not made): a's
    step 14 goes over 12, not 10. Once 12 is committed, 16 goes over 10."""
    with node_replicas(tmp_path, "b", lambda _offer: None) as b:
        assert b.address is not None
        mine = tmp_path / "mine"
        for step in (10, 12):
            fake_save(mine, step, generation=3)
            sender.send(b.address, Hello(JOB, "a", "b", 3), mine, OPEN)
        b.memory.mkdir()  # b's memory tier, where its agent writes the pin
        pin.write(b.memory, Pin((10, 3, 2)))
        fake_save(mine, 14, generation=3)
        sender.send(b.address, Hello(JOB, "a", "b", 3), mine, OPEN)
        assert steps_held(b.area / "a", 0) == [10, 14]
        pin.write(b.memory, Pin((14, 3, 2)))
        fake_save(mine, 16, generation=3)
        sender.send(b.address, Hello(JOB, "a", "b", 3), mine, OPEN)
        assert steps_held(b.area / "a", 0) == [14, 16]
        # a pin nodeagent did not write pins nothing: the copy goes to the older slot
        (b.memory / pin.FILE).write_text("{")
        fake_save(mine, 18, generation=3)
        sender.send(b.address, Hello(JOB, "a", "b", 3), mine, OPEN)
        assert steps_held(b.area / "a", 0) == [16, 18]


def test_a_fetch_never_goes_over_the_pinned_save(tmp_path: Path) -> None:
    with node_replicas(tmp_path / "a", "a", lambda _offer: None) as a:
        assert a.address is not None
        held = tier.slots(a.memory, 0)[0]
        area = tmp_path / "b-area" / "a"
        memory = tmp_path / "b-memory"
        memory.mkdir()
        for step in (10, 12, 14):
            fake_save(held, step, generation=3)
            want = Want(0, step, 3)
            if step == 14:
                pin.write(memory, Pin((10, 3, 2)))
            sender.fetch(a.address, Hello(JOB, "b", "a", 4), want, area, OPEN, memory=memory)
        assert steps_held(area, 0) == [10, 14]


def test_the_agent_pins_the_committed_save_the_record_names(tmp_path: Path) -> None:
    config = CheckpointConfig(memory_size=1 << 24, memory_dir=str(tmp_path), replicas=1)
    keeper = TierKeeper(config, "a", JOB)
    keeper.prepare(None)
    metrics = CheckpointMetrics(JOB, CollectorRegistry())
    with node_replicas(tmp_path, "a") as replicas:
        copies = ReplicaDuties(replicas, CopyState(), unbounded, terms("a"), metrics)
        duties = TierDuties(keeper, "a", metrics, copies)
        running = GroupStatus(3, GroupPhase.RUNNING)
        record = make_record(JobState.RUNNING, 3, MEMBERS, checkpoint=CheckpointRecord())
        duties.tick(running, record)
        assert pin.read(keeper.memory) == Pin(None)
        checkpoint = CheckpointRecord(committed_step=12, committed_generation=3, committed_world=2)
        duties.tick(running, replace(record, checkpoint=checkpoint))
        assert pin.read(keeper.memory) == Pin((12, 3, 2))
        (keeper.memory / pin.FILE).unlink()  # a pin written is not written again ...
        duties.tick(running, replace(record, checkpoint=checkpoint))
        assert pin.read(keeper.memory) is None
        later = replace(checkpoint, committed_step=18, replicas=1)
        duties.tick(running, replace(record, checkpoint=later))  # ... until it changes
        assert pin.read(keeper.memory) == Pin((18, 3, 2))
        # One member left of two: nothing can be committed, nothing is kept (no save waits).
        duties.tick(running, replace(record, checkpoint=later, members=("a",)))
        assert pin.read(keeper.memory) is None


def test_without_copies_to_peers_nothing_is_pinned(tmp_path: Path) -> None:
    """Without replicas every save is committed as it is made: a pin would only hold saves
    back until the record caught up."""
    config = CheckpointConfig(memory_size=1 << 24, memory_dir=str(tmp_path))
    keeper = TierKeeper(config, "a", JOB)
    keeper.prepare(None)
    duties = TierDuties(keeper, "a", CheckpointMetrics(JOB, CollectorRegistry()))
    checkpoint = CheckpointRecord(committed_step=12, committed_generation=3, committed_world=2)
    record = make_record(JobState.RUNNING, 3, MEMBERS, checkpoint=checkpoint)
    duties.tick(GroupStatus(3, GroupPhase.RUNNING), record)
    assert pin.read(keeper.memory) is None


def test_copies_of_the_step_committed_before_the_newest_are_kept(tmp_path: Path) -> None:
    """b holds copies of a's steps 6 and 12. Step 12 committed: nothing removed (6 was the
    committed one before, and the leader commits from reports a heartbeat old). Step 18
    committed: the copies older than 12 go."""
    metrics = CheckpointMetrics(JOB, CollectorRegistry())
    now = [0.0]
    with node_replicas(tmp_path, "b") as b:
        for step, slot in ((6, 0), (12, 1)):
            fake_save(tier.slots(b.area / "a", 0)[slot], step, generation=3)
        b.prepare(None)  # verified: what b reports and prunes
        share = Handout(3)
        state = CopyState(lambda: share)
        duties = ReplicaDuties(b, state, unbounded, terms("b"), metrics, clock=lambda: now[0])
        held = TierReport()
        for step, left in ((6, [6, 12]), (12, [6, 12]), (18, [12])):
            checkpoint = CheckpointRecord(
                committed_step=step, committed_generation=3, committed_world=2
            )
            now[0] += 60
            duties.tick(make_record(JobState.RUNNING, 3, MEMBERS, checkpoint=checkpoint), held)
            assert steps_held(b.area / "a", 0) == left, step


def test_saves_of_ranks_run_elsewhere_stay_until_the_new_world_commits(tmp_path: Path) -> None:
    """Issue 41: node a ran rank 3 of world 4 and restored step 45 (world 4) as rank 2 of
    world 3. Its save of old rank 3 may be all that is whole of step 45 until a step of the
    new generation is committed: kept until then, removed after."""
    config = CheckpointConfig(memory_size=1 << 24, memory_dir=str(tmp_path))
    keeper = TierKeeper(config, "a", JOB)
    keeper.prepare(None)
    fake_save(tier.slots(keeper.memory, 3)[0], 45, rank=3, world=4, generation=4)
    duties = TierDuties(keeper, "a", CheckpointMetrics(JOB, CollectorRegistry()))
    members = ("b", "c", "a")  # a is rank 2 of world 3
    logs = tmp_path / "logs"
    spec = WorkerSpec(2, 0, ("x",), {"NODEAGENT_JOB_ID": JOB}, None, logs / "x", logs / "p")
    restored = CheckpointRecord(committed_step=45, committed_generation=4, committed_world=4)
    record = make_record(JobState.RUNNING, 5, members, checkpoint=restored)
    duties.started(record, [spec], str(logs))
    said = restore_report_path(str(logs), JOB, 5, 2)
    said.parent.mkdir(parents=True, exist_ok=True)
    write_report(said, RestoreReport(2, "memory", 45, 1.0))
    running = GroupStatus(5, GroupPhase.RUNNING)
    duties.tick(running, record)  # the restore said: the old rank stays
    assert steps_held(keeper.memory, 3) == [45]
    new = CheckpointRecord(committed_step=50, committed_generation=5, committed_world=3)
    duties.tick(running, replace(record, checkpoint=new))
    assert not tier.rank_dir(keeper.memory, 3).exists()
