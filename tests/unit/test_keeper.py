"""The agent's TierKeeper (nodeagent/checkpoint/keeper.py) on real files: what it reports, what
it copies, and a settle that hangs not holding the job up. Saves made by hand, no torch."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from nodeagent.channel import manifests, tier
from nodeagent.channel.manifests import Manifest
from nodeagent.checkpoint import space
from nodeagent.checkpoint.keeper import PHASE_TRANSITIONS, TierKeeper, TierPhase
from nodeagent.checkpoint.space import check_room
from nodeagent.config.settings import CheckpointConfig
from nodeagent.config.values import check_name
from nodeagent.errors import ConfigError
from nodeagent.job.checkpoints.tierduties import TierDuties
from nodeagent.model.tiers import CheckpointRecord
from nodeagent.state import JobState
from nodeagent.supervisor.spec import WorkerSpec, restore_report_path
from nodeagent.supervisor.status import GroupPhase, GroupStatus
from nodeagent.telemetry.checkpoints import CheckpointMetrics
from tests.helpers.factories import make_record
from tests.helpers.tiers import fake_save


def keeper(tmp_path: Path, clock: list[float] | None = None) -> TierKeeper:
    config = CheckpointConfig(
        memory_size=1 << 30,
        memory_dir=str(tmp_path / "shm"),
        persist_dir=str(tmp_path / "persist"),
        persist_every=2,
    )
    now = clock if clock is not None else [0.0]
    return TierKeeper(config, "n0", "j", clock=lambda: now[0])


def settle(k: TierKeeper, persist: bool) -> None:
    k.settle(persist)
    deadline = time.monotonic() + 10
    while k.settling and time.monotonic() < deadline:
        time.sleep(0.01)
        k.poll()


def hanging_copies(k: TierKeeper) -> threading.Event:
    """From now on the keeper's copies hang (a persist_dir on a stuck mount) until the event
    returned is set."""
    release = threading.Event()

    def hang(persist: bool, _settle: bool) -> None:
        release.wait(30)

    k._work = hang  # type: ignore[method-assign]
    return release


def gone(path: Path) -> bool:
    """`path` is removed within 10 s (the keeper may remove it from a thread of its own)."""
    deadline = time.monotonic() + 10
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return not path.exists()


def test_it_reports_what_verifies_and_persists_the_newest_whole_step(tmp_path: Path) -> None:
    k = keeper(tmp_path)
    k.prepare(None)
    settle(k, persist=False)  # else it may verify step 10 before the bit is flipped (cached)
    for rank in (0, 1):
        fake_save(tier.slot_for_save(k.memory, rank), 10, rank=rank)
        fake_save(tier.slot_for_save(k.memory, rank), 12, rank=rank)
    bad = tier.newest_in_memory(k.memory, 1, step=10)
    assert bad is not None
    (bad / "__0_0.distcp").write_bytes(b"flipped")
    settle(k, persist=True)
    report = k.report()
    assert [(h.step, h.ranks) for h in report.memory] == [(12, (0, 1)), (10, (0,))]
    assert [(h.step, h.ranks) for h in report.persisted] == [(12, (0, 1))]
    assert manifests.verify(tier.rank_dir(tier.step_dir(tmp_path / "persist", 12), 1)).step == 12
    assert any("checksum" in p or "bytes" in p for p in k.problems)
    k.remove()  # at once, or once a copy under way ends: never blocking the agent's loop
    assert gone(k.memory)


def _bytes_read() -> int:
    """What this process read so far through read(2) (/proc/self/io's rchar): page cache and
    the holes of a sparse file count too."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


SPARSE = 2 << 30


@pytest.mark.parametrize("manifest_says", ["its true size", "a few bytes"])
def test_a_sparse_file_of_a_save_is_refused_before_a_byte_is_read(
    tmp_path: Path, manifest_says: str
) -> None:
    """Issue 52: the job's user left a 2 GiB sparse file in its tier under a manifest; the root
    agent's verify read all of it (5.8 s) before refusing it. Now a manifest naming more than
    a rank's save may take (memory_size 1 GiB, one rank: 512 MiB) is refused unread, and a file
    whose size is not the one its manifest names is not read either."""
    k = keeper(tmp_path)
    k.prepare(None)
    slot = tier.slot_for_save(k.memory, 0)
    fake_save(slot, 10)
    big = slot / "__0_0.distcp"
    with big.open("r+b") as f:
        f.truncate(SPARSE)  # a hole: no memory taken, 2 GiB to read
    found = manifests.read_manifest(slot)
    files = dict(found.files)
    if manifest_says == "its true size":
        files[big.name] = manifests.FileSum(SPARSE, sha256="0" * 64)
    manifests.write_manifest(slot, Manifest(10, 3, 2, 0, files, job="j"))
    before = _bytes_read()
    settle(k, persist=False)
    read = _bytes_read() - before
    assert read < 1 << 20, f"{read:,} bytes read"
    assert k.report().memory == ()
    said = " ".join(k.problems)
    if manifest_says == "its true size":
        named = sum(f.size for f in files.values())
        assert f"names {named:,} bytes, more than the {1 << 29:,}" in said, said
    else:
        assert f"{SPARSE} bytes, the manifest says" in said, said


def test_a_settle_that_hangs_stops_holding_the_generation_up(tmp_path: Path) -> None:
    now = [0.0]
    k = keeper(tmp_path, now)
    k.prepare(None)
    settle(k, persist=False)
    release = hanging_copies(k)
    k.settle(persist=True)  # a persist_dir on a stuck mount
    assert k.settling
    now[0] = k.settle_timeout - 1
    assert k.settling
    now[0] = k.settle_timeout + 1
    assert not k.settling  # the job goes on; the copy may still finish
    assert any("more than 300s" in p for p in k.slow)
    release.set()


def test_removing_the_tier_never_waits_for_a_copy_that_hangs(tmp_path: Path) -> None:
    k = keeper(tmp_path)
    k.prepare(None)
    settle(k, persist=False)
    release = hanging_copies(k)
    k.settle(persist=True)
    k.remove()  # returned while the copy hangs: the tier is moved aside, and goes after
    [aside] = [p for p in k.memory.parent.iterdir() if p.name.startswith(f".{k.memory.name}.")]
    again = keeper(tmp_path)  # the node placed on the job again meanwhile
    again.prepare(None)
    settle(again, persist=False)
    fake_save(tier.slot_for_save(again.memory, 0), 3)
    release.set()
    assert gone(aside)
    assert (
        manifests.verify(tier.newest_in_memory(again.memory, 0, step=3) or again.memory).step == 3
    )


def test_a_restore_report_nodeagent_did_not_write_is_dropped_not_trusted(tmp_path: Path) -> None:
    k = keeper(tmp_path)
    k.prepare(None)
    reports = {r: tmp_path / f"r{r}.json" for r in range(4)}
    k.started(3, (0, 1, 2, 3), reports)

    def report(rank: int, source: str, kind: str, reason: str) -> str:
        refused = {"source": source, "kind": kind, "reason": reason}
        return json.dumps(
            {"rank": rank, "tier": "start", "step": None, "seconds": 0.1, "refused": [refused]}
        )

    reports[0].write_text(report(0, "memory:x", "bad_state", "non-finite value"))
    reports[1].write_bytes(b"{" + b" " * (70 << 10))  # more than the agent reads
    reports[2].write_text(report(2, "memory:7", "bad_state", "step 7 holds a non-finite value"))
    reports[3].write_text(report(3, "memory:9", "fatal", "a kind no worker says"))
    notes = k.restores()
    assert sorted(n.rank for n in notes) == [0, 2]  # the oversized and the unknown kind dropped
    assert not reports[1].exists() and not reports[3].exists()
    assert k.report().refused == (7,)  # 'memory:x' named no step: nothing condemned by it


@pytest.mark.parametrize("made_by", ["a link", "another user", "a group-writable mode"])
def test_a_memory_dir_someone_else_controls_is_refused(tmp_path: Path, made_by: str) -> None:
    """The agent (root) sets the tier's owner: a user who made memory_dir first (on a shared
    tmpfs) must not choose what that reaches."""
    k = keeper(tmp_path)
    parent = k.memory.parent
    if made_by == "a link":
        (tmp_path / "elsewhere").mkdir()
        parent.symlink_to(tmp_path / "elsewhere")
    else:
        parent.mkdir()
        if made_by == "another user":
            os.chown(parent, 65534, 65534)
        else:
            os.chmod(parent, 0o775)
    with pytest.raises(ConfigError, match=r"job\.checkpoint\.memory_dir: .* no one else may write"):
        k.prepare(None)
    with pytest.raises(ConfigError, match="no one else may write"):
        check_room(CheckpointConfig(memory_size=1, memory_dir=str(parent)), "n0", "j")


def test_a_link_where_the_tier_goes_is_refused_not_followed(tmp_path: Path) -> None:
    k = keeper(tmp_path)
    k.memory.parent.mkdir(mode=0o755)
    (tmp_path / "etc").mkdir(mode=0o755)
    k.memory.symlink_to(tmp_path / "etc")
    with pytest.raises(ConfigError, match="a link where the tier goes, not a directory"):
        k.prepare(65534)
    assert (tmp_path / "etc").stat().st_uid == os.geteuid()  # not handed to the user


def test_no_job_id_names_another_jobs_replica_area(tmp_path: Path) -> None:
    """Issue 52: jobs `train` and `train.replicas` on one node, the default layout. The second
    job's tier was the first one's replica area: its keeper took it over and its user planted
    a copy there that the first job restored. Now the two cannot meet (a job id holds no '+'),
    and each is made and marked beside the other."""
    config = CheckpointConfig(memory_size=1 << 20, memory_dir=str(tmp_path / "shm"))
    area = Path(config.replica_area("n0", "train"))
    second = TierKeeper(config, "n0", "train.replicas")
    assert second.memory != area
    with pytest.raises(ConfigError, match="letters, digits"):
        check_name(area.name.split(".", 1)[1], "job.id")  # no job's tier is named so
    space.make_marked(area, "the replica area", 0o750, "n0", "train")
    second.prepare(None)
    first = TierKeeper(config, "n0", "train")
    first.prepare(None)
    assert space.owner(area) == ("n0", "train")
    assert space.owner(second.memory) == ("n0", "train.replicas")
    assert space.owner(first.memory) == ("n0", "train")
    assert len({area, second.memory, first.memory}) == 3


def test_a_directory_marked_as_another_jobs_is_refused_not_taken_over(tmp_path: Path) -> None:
    k = keeper(tmp_path)
    k.memory.parent.mkdir(mode=0o755)
    k.memory.mkdir(mode=0o750)
    fd = os.open(k.memory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        space.mark(fd, "n0", "other")
    finally:
        os.close(fd)
    os.chown(k.memory, 65534, 65534)
    with pytest.raises(ConfigError, match="is job other's on node n0, not j's: refused"):
        k.prepare(2001)
    st = k.memory.stat()
    assert (st.st_uid, st.st_mode & 0o7777) == (65534, 0o750)  # neither chowned nor chmodded
    assert space.owner(k.memory) == ("n0", "other")


def test_a_group_that_ended_holds_the_next_generation_back_before_its_settle_began(
    tmp_path: Path,
) -> None:
    """The group may end between the agent's tier duties and its decision in one tick: the
    decision must not acknowledge the next generation before the settle began. Found by an
    in_place scale under load: the leader restored step 28, every rank had saved 30."""
    k = keeper(tmp_path)
    k.prepare(None)
    settle(k, persist=False)
    duties = TierDuties(k, "n0", CheckpointMetrics("j", CollectorRegistry()))
    running = GroupStatus(4, GroupPhase.RUNNING)
    parked = GroupStatus(4, GroupPhase.PARKED)
    assert not duties.holds_back(running)
    duties.tick(running, None)
    assert duties.holds_back(parked)  # ended, not settled yet: hold back
    release = hanging_copies(k)
    duties.tick(parked, None)  # the settle begins (and hangs)
    assert duties.holds_back(parked) and k.settling
    release.set()
    deadline = time.monotonic() + 10
    while k.settling and time.monotonic() < deadline:
        time.sleep(0.01)
        k.poll()
    assert not duties.holds_back(parked)  # settled: the next generation may come


def test_the_keepers_phases_follow_its_table(tmp_path: Path) -> None:
    k = keeper(tmp_path)
    seen = [k.phase]
    k.prepare(None)  # what an earlier agent's workers left is verified first
    seen.append(k.phase)
    assert space.owner(k.memory) == ("n0", "j")  # marked: a sweep tells it from others
    settle(k, persist=False)
    seen.append(k.phase)
    k.remove()
    seen.append(k.phase)
    assert k.removed
    with pytest.raises(ValueError, match="removed -> settling"):
        k._move(TierPhase.SETTLING, "a settle of a removed tier")
    k.prepare(None)  # the job restarted on this node
    seen.append(k.phase)
    assert [p.value for p in seen] == ["active", "settling", "active", "removed", "settling"]
    assert set(PHASE_TRANSITIONS) == set(TierPhase)


def test_after_a_rollback_the_new_timelines_saves_are_persisted(tmp_path: Path) -> None:
    """Step 30 of generation 5 was persisted here (not by every node: not whole); the job went
    back to an older step and, in generation 7, saved step 27 on leaving (a scale): it must be
    copied, or the new world resumes further back."""
    k = keeper(tmp_path)
    k.prepare(None)
    settle(k, persist=False)
    fake_save(tier.slot_for_save(k.memory, 0), 30, world=1, generation=5)
    settle(k, persist=True)
    abandoned = tier.newest_in_memory(k.memory, 0, step=30)
    assert abandoned is not None
    manifests.begin(
        abandoned
    )  # the restore of an older step forgets it (Checkpointer._forget_after)
    fake_save(tier.slot_for_save(k.memory, 0), 27, world=1, generation=7)
    settle(k, persist=True)
    assert (27, 7) in [(h.step, h.generation) for h in k.report().persisted]


@pytest.mark.parametrize(("saves", "said"), [(2, 2), (None, 0), ("two", None)])
def test_the_restored_event_says_how_many_saves_a_rank_read(
    tmp_path: Path, saves: object, said: int | None
) -> None:
    """A report without `saves` (an older worker) says 0; one with garbage there is dropped."""
    k = keeper(tmp_path)
    k.prepare(None)
    duties = TierDuties(k, "n0", CheckpointMetrics("j", CollectorRegistry()))
    chosen = CheckpointRecord(restore=("memory:20@2", "start"), newest=20)
    record = make_record(JobState.RUNNING, 3, ("n0",), checkpoint=chosen)
    logs = str(tmp_path / "logs")
    spec = WorkerSpec(0, 0, ("train",), {"NODEAGENT_JOB_ID": "j"}, None, tmp_path / "l", tmp_path)
    duties.started(record, [spec], logs)
    note: dict[str, object] = {"rank": 0, "tier": "memory", "step": 20, "seconds": 0.1}
    note["refused"] = []
    if saves is not None:
        note["saves"] = saves
    path = restore_report_path(logs, "j", 3, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(note))
    events = duties.tick(GroupStatus(3, GroupPhase.RUNNING), record)
    restored = [e.data for e in events if e.type == "checkpoint_restored"]
    if said is None:
        assert restored == []
    else:
        [data] = restored
        assert (data["step"], data["saves"]) == (20, said)


@pytest.mark.parametrize(
    ("tier_name", "step", "said"),
    [
        ("start", None, True),
        ("persistent", 10, True),
        ("persistent", 20, False),
        ("memory", 20, False),
    ],
)
def test_ranks_that_restored_an_older_step_than_offered_first_say_so(
    tmp_path: Path, tier_name: str, step: int | None, said: bool
) -> None:
    """`checkpoint_fallback`: the leader offered step 20 from memory first; the rank restored
    the start, or step 10. The same step from another tier loses nothing: nothing said."""
    k = keeper(tmp_path)
    k.prepare(None)
    duties = TierDuties(k, "n0", CheckpointMetrics("j", CollectorRegistry()))
    order = ("memory:20@2", "persistent:20@2", "persistent:10@1", "script", "start")
    chosen = CheckpointRecord(restore=order, newest=20)
    record = make_record(JobState.RUNNING, 3, ("n0",), checkpoint=chosen)
    logs = str(tmp_path / "logs")
    spec = WorkerSpec(0, 0, ("train",), {"NODEAGENT_JOB_ID": "j"}, None, tmp_path / "l", tmp_path)
    duties.started(record, [spec], logs)
    refused = {"source": "memory:20@2", "kind": "bad_copy", "reason": "checksum 1 != 2"}
    note = {"rank": 0, "tier": tier_name, "step": step, "seconds": 0.1, "refused": [refused]}
    path = restore_report_path(logs, "j", 3, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(note))
    events = duties.tick(GroupStatus(3, GroupPhase.RUNNING), record)
    fell = [e for e in events if e.type == "checkpoint_fallback"]
    assert [e.type for e in events if e.type == "checkpoint_restored"] == ["checkpoint_restored"]
    if not said:
        assert fell == []
        return
    [event] = fell
    assert event.data == {"offered": 20, "source": "memory:20@2", "step": step, "tier": tier_name}
    assert "not step 20 (memory:20@2) offered first: memory:20@2: checksum 1 != 2" in event.message
