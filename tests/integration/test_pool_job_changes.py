"""The pool leader's read of only the jobs changed since its last read (the job changes set,
coord/poolreplies.HeldJobs), against a real redis-server: after every kind of write (a
submission, an array, the leader's rounds, a spec replaced by a scale, a cancel, an id taken
over, pruning) what the leader holds is what a reader of every job sees; what nobody noted (a
status written by hand) is seen at its next read of them all; a changes key holding garbage
makes it read them all, and breaks no write."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from nodeagent.coord import ended, poolreplies
from nodeagent.coord.client import connect
from nodeagent.coord.keys import PoolKeys
from nodeagent.coord.pool import PoolSnapshot, PoolStore
from nodeagent.errors import CoordinationError
from nodeagent.model.job import Event
from nodeagent.model.pool import PoolJobState, PoolNode
from nodeagent.model.spec import JobSpec, load_spec
from nodeagent.pool import leadership
from nodeagent.pool.schedule import SchedulePolicy
from tests.helpers.cluster import RedisServer

NEVER = 100_000  # nodes a job asks for: more than the pool has, so it stays pending


def spec(job: str, **more: object) -> JobSpec:
    return load_spec(
        {"id": job, "entrypoint": ["true"], "min_nodes": 1, "max_nodes": NEVER, **more},
        default_user="nobody",
    )


class Pool:
    """A pool with one node, its leader's store and another reader's (which reads every job)."""

    def __init__(self, redis_server: RedisServer, name: str) -> None:
        keys = PoolKeys("nodeagent", name)
        self.leading = PoolStore(connect(redis_server.url, 10.0), keys)
        self.other = PoolStore(connect(redis_server.url, 10.0), keys)
        beat = self.leading.sync(
            PoolNode(name="n0", address="127.0.0.1", lease_ttl_ms=600_000, labels={}, metrics="")
        )
        assert beat.leader is not None
        self.leader = beat.leader
        self.views = leadership.NodeViews()

    def read(self) -> PoolSnapshot:
        """The leader's read, checked against the other reader's."""
        mine = self.leading.read(self.leader)
        theirs = self.other.read()
        assert dict(mine.jobs) == dict(theirs.jobs)
        live = [j for j, status in theirs.jobs.items() if not status.state.ended]
        assert self.leading.specs(live, mine.jobs_changed) == self.other.specs(live)
        return mine

    def round(self) -> None:
        leadership.lead(self.leading, self.leader, SchedulePolicy(), self.views)


def changed_since(snap: PoolSnapshot, jobs: set[str]) -> None:
    """`snap` read only the jobs changed since the leader's last read, `jobs` among them (and
    perhaps some changed in the very millisecond of that read: read again, to miss none)."""
    assert snap.jobs_changed is not None and jobs <= snap.jobs_changed, snap.jobs_changed


def test_the_leader_reads_only_what_changed_and_holds_what_everyone_sees(
    redis_server: RedisServer, job_id: str
) -> None:
    pool = Pool(redis_server, f"{job_id}-pool")
    first = pool.read()
    assert first.jobs_changed is None  # a new term: every job read
    assert pool.read().jobs_changed == frozenset()  # then only what changed: nothing

    big = spec(f"{job_id}-a", min_nodes=NEVER)
    pool.leading.submit(big)
    pool.leading.submit(spec(f"{job_id}-b", max_nodes=4))
    changed_since(pool.read(), {f"{job_id}-a", f"{job_id}-b"})

    tasks = [spec(f"{job_id}-t{i}", min_nodes=NEVER) for i in range(3)]
    pool.other.submit_many(tasks, "", Event("job_submitted", message="an array"))
    changed_since(pool.read(), {t.id for t in tasks})

    pool.round()  # b admitted on the pool's node; the others say why they wait
    after = pool.read()
    assert after.jobs[f"{job_id}-b"].state is PoolJobState.RUNNING
    assert after.jobs[f"{job_id}-a"].reason != "submitted"
    changed_since(after, {f"{job_id}-a"})  # its own commit, read back

    scaled = replace(big, job=replace(big.job, min_nodes=2, target_nodes=2))
    pool.other.replace_spec(scaled)  # scale of a pending job (nodeagentctl under auth none)
    changed = pool.read()
    changed_since(changed, {f"{job_id}-a"})
    spec_read = pool.leading.specs([f"{job_id}-a"], changed.jobs_changed)[f"{job_id}-a"]
    assert isinstance(spec_read, JobSpec) and spec_read.job.min_nodes == 2

    pool.other.cancel(f"{job_id}-t0", "test")
    pool.round()
    assert pool.read().jobs[f"{job_id}-t0"].state is PoolJobState.CANCELLED
    pool.other.submit(spec(f"{job_id}-t0", min_nodes=NEVER))  # its id taken over
    again = pool.read()
    assert again.jobs[f"{job_id}-t0"].state is PoolJobState.PENDING

    pool.round()  # t0's old keys cleared, ...
    pool.other.cancel(f"{job_id}-t1", "test")
    pool.round()
    now = pool.leading.read(pool.leader).now_ms
    assert ended.prune(pool.leading.client, pool.leading.keys, pool.leader, now, [f"{job_id}-t1"])
    pruned = pool.read()
    assert f"{job_id}-t1" not in pruned.jobs
    changed_since(pruned, {f"{job_id}-t1"})


def test_what_nobody_noted_is_read_at_the_next_read_of_every_job(
    redis_server: RedisServer, job_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(poolreplies, "JOBS_REREAD_MS", 2_000)  # every job read every 2 s
    pool = Pool(redis_server, f"{job_id}-pool")
    pool.leading.submit(spec(f"{job_id}-a", min_nodes=NEVER))
    time.sleep(0.01)  # the next read later than its note (a change at a read's ms is read again)
    pool.read()
    pool.leading.client.hset(pool.leading.keys.jobs, f"{job_id}-a", "not a status")  # by hand
    first = pool.leading.read(pool.leader)
    assert first.jobs_changed is not None and f"{job_id}-a" in first.jobs  # not noted: unread
    deadline = time.monotonic() + 30
    whole = first
    while whole.jobs_changed is not None:  # every job read again within 2 s of Redis' time
        assert time.monotonic() < deadline, "the leader never read every job again"
        time.sleep(0.05)
        whole = pool.leading.read(pool.leader)
    assert f"{job_id}-a" not in whole.jobs
    assert any(f"{job_id}-a" in said for said in whole.garbage)
    later = pool.leading.read(pool.leader)
    assert later.jobs_changed == frozenset() and later.garbage == whole.garbage  # said still


def test_a_changes_key_holding_garbage_makes_the_leader_read_every_job(
    redis_server: RedisServer, job_id: str
) -> None:
    pool = Pool(redis_server, f"{job_id}-pool")
    pool.leading.client.set(pool.leading.keys.job_changes, "garbage")
    created, _ = pool.other.submit(spec(f"{job_id}-a", min_nodes=NEVER))
    assert created  # the note is skipped, the submission is not
    pool.read()
    pool.other.submit(spec(f"{job_id}-b", min_nodes=NEVER))
    snap = pool.read()
    assert snap.jobs_changed is None and f"{job_id}-b" in snap.jobs
    pool.round()  # its commit skips the note too
    assert pool.read().jobs[f"{job_id}-b"].reason != "submitted"


def test_a_round_whose_specs_read_failed_reads_every_job_next(
    redis_server: RedisServer, job_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its statuses were read, the specs of the jobs they name were not: the next read must
    not take them as read (a scaled job would keep its old spec until a full read)."""
    pool = Pool(redis_server, f"{job_id}-pool")
    pool.leading.submit(spec(f"{job_id}-a", min_nodes=NEVER))
    pool.read()

    def away(ids: object, changed: object = None) -> dict[str, JobSpec | str]:
        raise CoordinationError("read job specs: Redis away")

    monkeypatch.setattr(pool.leading, "specs", away)
    with pytest.raises(CoordinationError):
        leadership.read_view(pool.leading, pool.leader)
    monkeypatch.undo()
    assert pool.read().jobs_changed is None
