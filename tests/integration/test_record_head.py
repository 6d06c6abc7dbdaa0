"""What a node that does not lead reads of the record: its head and the node's own rank, not the
member list (scripts.SYNC, COMMIT; JobRecord.head_json, from_head), against a real redis-server.

At 10,000 nodes the member list is 90 KB and every node reads the record at every new revision:
0.9 GB out of Redis per record written. These tests check that a follower's reply holds no
member list, that it still acts on the right rank, world size and master, and that whatever
goes wrong with the head or the ranks hash costs a whole-record read, never a wrong rank.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import redis

from nodeagent.coord import scripts
from nodeagent.coord.bounded import unbounded
from nodeagent.coord.client import connect
from nodeagent.coord.keys import JobKeys
from nodeagent.coord.store import JobStore, Snapshot
from nodeagent.job.leadership import Leadership
from nodeagent.job.plan import LeaderMemory, Plan, Policy
from nodeagent.model.job import JobRecord, NodeReport
from nodeagent.state import JobState, NodeState
from nodeagent.telemetry.metrics import AgentMetrics
from tests.helpers.cluster import RedisServer
from tests.helpers.factories import make_record

MEMBERS = ("a", *(f"n{i:04d}" for i in range(1, 2345)))  # ranks in 3 pages (RANKS_PAGE)


def report(name: str) -> NodeReport:
    return NodeReport(name, "127.0.0.1", NodeState.READY, free_port=1, lease_ttl_ms=5000)


class Job:
    """A leader `boss` (no member) and followers, each with its own store (a store holds what
    it read)."""

    def __init__(self, server: RedisServer, job_id: str) -> None:
        self.server = server
        self.keys = JobKeys("nodeagent", job_id)
        self.leader = self.store()
        self.raw = redis.Redis.from_url(server.url, decode_responses=True)

    def store(self) -> JobStore:
        return JobStore(connect(self.server.url, 2.0), self.keys)

    def lead(self) -> Snapshot:
        snapshot = self.leader.sync(report("boss"))
        assert snapshot.leader_name == "boss"
        return snapshot

    def commit(self, record: JobRecord) -> None:
        snapshot = self.lead()
        plan = Plan(record, (), (), LeaderMemory(), "test")
        self.leader.commit(snapshot.leader or "", snapshot.rev, plan)


def record(members: tuple[str, ...] = MEMBERS, gen: int = 1) -> JobRecord:
    # STOPPED: the leader's plan writes nothing more (the nodes it names hold no leases here)
    return make_record(JobState.STOPPED, gen, members, target_nodes=1000, max_nodes=1000)


def test_a_follower_reads_the_head_and_its_own_rank(redis_server: RedisServer, job_id: str) -> None:
    job = Job(redis_server, job_id)
    written = record()
    job.commit(written)
    stored = job.raw.hgetall(job.keys.record)
    assert len(stored["head"]) < 400 < 15_000 < len(stored["record"])  # no member list in it
    for name, rank in (("n0500", 500), ("a", 0), ("n2344", 2344), ("outsider", None)):
        snap = job.store().sync(report(name))
        got = snap.record
        assert snap.held is not None and snap.held.head, name
        assert got is not None and got.group_rank(name) == rank
        assert len(got.members) == 2345 and got.members[0] == "a"
        assert replace(got, members=MEMBERS) == written  # the rest of the record is all there
        assert not snap.garbage
    # The leader reads the whole record.
    assert job.lead().record == written


def test_the_ranks_are_written_only_when_the_members_or_generation_change(
    redis_server: RedisServer, job_id: str
) -> None:
    job = Job(redis_server, job_id)
    job.commit(record())
    ranks = job.raw.hgetall(job.keys.ranks)
    assert ranks.pop(".members") == record().members_digest
    assert ranks == {name: str(i) for i, name in enumerate(MEMBERS)}
    job.raw.hset(job.keys.ranks, "marker", "1")  # (a name no node has)
    job.commit(replace(record(), reason="same members"))
    assert job.raw.hget(job.keys.ranks, "marker") == "1"  # not rewritten
    fewer = MEMBERS[:-1]
    job.commit(record(fewer, gen=2))
    ranks = job.raw.hgetall(job.keys.ranks)
    assert ranks.pop(".members") == record(fewer, gen=2).members_digest
    assert ranks == {name: str(i) for i, name in enumerate(fewer)}  # marker and n2344 gone
    assert job.store().sync(report("n2344")).record.group_rank("n2344") is None  # type: ignore[union-attr]


def test_without_the_ranks_hash_followers_read_the_whole_record_until_the_leader_rewrites_it(
    redis_server: RedisServer, job_id: str
) -> None:
    job = Job(redis_server, job_id)
    job.commit(record())
    job.raw.delete(job.keys.ranks)
    follower = job.store()
    snap = follower.sync(report("n0500"))
    assert snap.held is not None and not snap.held.head  # the whole record, as before
    assert snap.record == record() and not snap.garbage
    rev = snap.rev
    led = job.lead()
    assert led.stale_head == "the ranks hash's field .members is missing"
    assert not led.garbage  # missing is no garbage (an older nodeagent wrote no ranks)
    _tick(job, led)
    assert job.raw.hget(job.keys.ranks, "n0500") == "500"
    snap = follower.sync(report("n0500"))
    assert snap.rev > rev and snap.held is not None and snap.held.head
    assert snap.record is not None and snap.record.group_rank("n0500") == 500


def test_an_impossible_rank_is_garbage_and_the_whole_record_is_read(
    redis_server: RedisServer, job_id: str
) -> None:
    """The leader does not read 10,000 ranks at every heartbeat: a node checks its own, and
    reads the whole record when it is not one a leader wrote (until the members change)."""
    job = Job(redis_server, job_id)
    job.commit(record())
    for forged in ("5000", "0", "x"):  # beyond the members; rank 0 is a's; no number
        job.raw.hset(job.keys.ranks, "n0500", forged)
        job.raw.hincrby(job.keys.record, "rev", 1)  # (a follower reads a new revision only)
        snap = job.store().sync(report("n0500"))
        assert snap.record == record()  # the whole record: the right rank
        problems = [g for g in snap.garbage if g.kind == "job"]
        assert problems and problems[0].action == "n0500 reads the whole record", snap.garbage
        assert forged in problems[0].problem or "rank-0" in problems[0].problem


def test_a_garbage_head_is_read_around_and_written_again(
    redis_server: RedisServer, job_id: str
) -> None:
    job = Job(redis_server, job_id)
    job.commit(record())
    job.raw.hset(job.keys.record, "head", "{x")
    job.raw.hincrby(job.keys.record, "rev", 1)
    snap = job.store().sync(report("n0500"))
    assert snap.record == record()
    problems = [g for g in snap.garbage if g.kind == "job"]
    assert problems and problems[0].action == "n0500 reads the whole record", snap.garbage
    led = job.lead()
    assert led.stale_head == "field head is not the record's: '{x'"
    assert [g.action for g in led.garbage] == ["written again at a new revision"]
    _tick(job, led)  # the leader writes the record again, and its head
    assert job.lead().stale_head is None
    snap = job.store().sync(report("n0500"))
    assert snap.held is not None and snap.held.head and not snap.garbage
    assert snap.record is not None and snap.record.group_rank("n0500") == 500


def test_a_record_with_no_head_is_read_whole(redis_server: RedisServer, job_id: str) -> None:
    """As an older nodeagent wrote it: the leader writes its head at once."""
    job = Job(redis_server, job_id)
    job.commit(record())
    job.raw.hdel(job.keys.record, "head", "members")
    job.raw.hincrby(job.keys.record, "rev", 1)
    snap = job.store().sync(report("n0500"))
    assert snap.held is not None and not snap.held.head and snap.record == record()
    led = job.lead()
    assert led.stale_head == "field head is missing"
    _tick(job, led)
    assert job.store().sync(report("n0500")).held.head  # type: ignore[union-attr]


POLICY = Policy(
    min_nodes=1,
    max_nodes=1000,
    target_nodes=1000,
    nproc_per_node=1,
    max_restarts=3,
    join_settle_ms=0,
    rendezvous_timeout_ms=60_000,
)


def _tick(job: Job, snapshot: Snapshot) -> None:
    """One leader plan and write, as the agent runs it: the plan for a stopped job writes
    nothing, so what is written is the record again."""
    metrics = AgentMetrics(job.keys.job)
    leadership = Leadership(job.leader, POLICY, metrics, 5.0, lambda: 0.0, unbounded)
    assert snapshot.leader is not None
    led = leadership.lead(snapshot.leader, snapshot)
    assert led.record == snapshot.record and led.rev == snapshot.rev + 1


def test_ranks_are_written_in_fenced_pages_and_made_the_records_by_its_commit(
    redis_server: RedisServer, job_id: str
) -> None:
    job = Job(redis_server, job_id)
    job.commit(record())
    leader = job.lead().leader or ""
    other = record(MEMBERS[:10], gen=2)
    write = job.leader.client.register_script(scripts.WRITE_RANKS.source)
    keys = [job.keys.leader, job.keys.ranks]

    def page(value: str, first: int, names: tuple[str, ...], digest: str = "") -> object:
        return write(keys=keys, args=[value, digest or other.members_digest, first, *names])

    with pytest.raises(redis.ResponseError, match="FENCED leader lease"):
        page("boss 999", 0, other.members)  # a deposed leader's token
    assert job.raw.hget(job.keys.ranks, "n0500") == "500"  # untouched
    page(leader, 0, other.members[:5])
    with pytest.raises(redis.ResponseError, match="were replaced meanwhile"):
        page(leader, 5, other.members[5:], digest="another list")
    # Written but not committed: nodes that read the record (at a new revision) read it whole.
    job.raw.hincrby(job.keys.record, "rev", 1)
    snap = job.store().sync(report("n0500"))
    assert snap.held is not None and not snap.held.head and snap.record == record()
    # The leader's commit writes the ranks (all pages again) and makes them the record's.
    snapshot = job.lead()
    job.leader.commit(leader, snapshot.rev, Plan(other, (), (), LeaderMemory(), "test"))
    assert job.raw.hget(job.keys.ranks, ".members") == other.members_digest
    assert job.raw.hget(job.keys.ranks, ".pending") is None
    snap = job.store().sync(report("n0007"))
    assert snap.held is not None and snap.held.head
    assert snap.record is not None and snap.record.group_rank("n0007") == 7


def test_a_new_generation_writes_the_ranks_again(redis_server: RedisServer, job_id: str) -> None:
    """Two ranks swapped by hand: plausible to each node, so acted on (two nodes with one
    rank: the rendezvous fails). The next generation, even with the same members, writes
    every rank again."""
    job = Job(redis_server, job_id)
    job.commit(record())
    job.raw.hset(job.keys.ranks, mapping={"n0500": "501", "n0501": "500"})
    job.raw.hincrby(job.keys.record, "rev", 1)
    swapped = job.store().sync(report("n0500")).record
    assert swapped is not None and swapped.group_rank("n0500") == 501  # not detectable here
    job.commit(record(gen=2))  # the same members
    assert job.raw.hmget(job.keys.ranks, "n0500", "n0501") == ["500", "501"]
    snap = job.store().sync(report("n0500"))
    assert snap.record is not None and snap.record.group_rank("n0500") == 500
