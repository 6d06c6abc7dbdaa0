"""Garbage written into a job's Redis keys, against a real redis-server and the real scripts.

Each case writes one kind of garbage under a job that has formed (leader a, follower b, a
RUNNING record), then every reader runs: the leader's heartbeat, a follower's, nodeagentctl's
snapshot. None may raise; the garbage must be reported with its kind of key; and after one round
of the real leader (Leadership: plan and fenced commit) it must be gone or ignored for good.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest
import redis

from nodeagent.coord.bounded import unbounded
from nodeagent.coord.client import connect
from nodeagent.coord.keys import JobKeys
from nodeagent.coord.store import JobStore, Snapshot
from nodeagent.job.leadership import Leadership
from nodeagent.job.plan import LeaderMemory, Plan, Policy
from nodeagent.job.verify import RecordCheck
from nodeagent.model.job import Command, CommandType, JobRecord, NodeReport
from nodeagent.state import JobState, NodeState
from nodeagent.telemetry.metrics import AgentMetrics
from tests.helpers.cluster import RedisServer
from tests.helpers.factories import make_record

TTL = 5000
POLICY = Policy(
    min_nodes=1,
    max_nodes=3,
    target_nodes=2,
    nproc_per_node=1,
    max_restarts=3,
    join_settle_ms=0,
    rendezvous_timeout_ms=60_000,
)


def report(name: str, acked: int = 1, ttl_ms: int = TTL, **changes: object) -> NodeReport:
    base = NodeReport(
        name=name,
        address=f"127.0.0.{ord(name[0]) - 96}",
        state=NodeState.RUNNING,
        acked_generation=acked,
        worker_generation=acked,
        free_port=29000 + ord(name[0]),
        lease_ttl_ms=ttl_ms,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


@dataclass
class Job:
    """A formed job: a leads, b follows, generation 1 runs on (a, b) with a as master."""

    store: JobStore  # a's
    follower: JobStore  # b's
    raw: redis.Redis
    keys: JobKeys
    metrics: AgentMetrics
    leadership: Leadership
    follower_counts: list[str]

    def lead(self) -> Snapshot:
        """One heartbeat of a and, as the agent does, its plan and fenced commit."""
        snap = self.store.sync(report("a"))
        assert snap.leader_name == "a"
        token = snap.leader
        assert token is not None
        self.leadership.lead(token, snap)
        return snap

    def garbage_kinds(self, snap: Snapshot) -> set[str]:
        return {g.kind for g in snap.garbage}


def form(server: RedisServer, job: str) -> Job:
    keys = JobKeys("nodeagent", job)
    store = JobStore(connect(server.url, 2.0), keys)
    metrics = AgentMetrics(job)
    leadership = Leadership(store, POLICY, metrics, TTL / 1000, time.monotonic, unbounded)
    follower = JobStore(connect(server.url, 2.0), keys)
    follower.check = RecordCheck(follower.keys.record, 1, follower.read_lease)
    follower_counts: list[str] = []
    follower.garbage.count_with(follower_counts.append)
    snap = store.sync(report("a"))
    follower.sync(report("b"))
    a = report("a")
    record = make_record(
        JobState.RUNNING,
        1,
        ("a", "b"),
        target_nodes=2,
        max_nodes=3,
        master_addr=a.address,
        master_port=a.free_port,
    )
    assert snap.leader is not None
    plan = Plan(record, (), (), LeaderMemory(), "test")
    store.commit(snap.leader, snap.rev, plan)
    raw = redis.Redis.from_url(server.url)
    job_ = Job(store, follower, raw, keys, metrics, leadership, follower_counts)
    assert follower.sync(report("b")).record == record
    return job_


Write = Callable[[redis.Redis, JobKeys], object]
PHANTOM_TTL = 400


def node_report(name: str, **fields: object) -> bytes:
    """A report as JSON, with `fields` replaced by anything (garbage)."""
    doc = json.loads(report(name).to_json())
    doc.update(fields)
    return json.dumps(doc).encode()


def phantom(name: str, raw_report: bytes | str) -> Write:
    """A lease and a node key written by hand, with a consistent (short) TTL."""

    def write(r: redis.Redis, k: JobKeys) -> None:
        now_ms = int(r.time()[0]) * 1000
        r.set(k.node(name), raw_report, px=PHANTOM_TTL)
        r.zadd(k.leases, {name: now_ms + PHANTOM_TTL})

    return write


def then(*writes: Write) -> Write:
    def write(r: redis.Redis, k: JobKeys) -> None:
        for w in writes:
            w(r, k)

    return write


def wrong_type(key: Callable[[JobKeys], str]) -> Write:
    def write(r: redis.Redis, k: JobKeys) -> object:
        pipe = r.pipeline(transaction=True)
        pipe.delete(key(k))
        pipe.sadd(key(k), "garbage")
        return pipe.execute()

    return write


def command(raw: str) -> Write:
    return lambda r, k: r.xadd(k.commands, {"command": raw})


@dataclass(frozen=True)
class Case:
    id: str
    write: Write
    kind: str  # the kind of key it is reported as (garbage.KINDS)
    seen_by: str = "leader"  # or "follower": who reads it first
    repaired: bool = True  # False: ignored for as long as it stays
    settle: float = 0.0  # seconds until it is gone by itself (a phantom's TTL)


FAR = 10**15
CASES = [
    Case("rev-abc", lambda r, k: r.hset(k.record, "rev", "abc"), "job", "follower"),
    Case("rev-float", lambda r, k: r.hset(k.record, "rev", "2.5"), "job"),
    Case("gen-abc", lambda r, k: r.hset(k.record, "gen", "abc"), "job"),
    Case("gen-ahead", lambda r, k: r.hset(k.record, "gen", "999999"), "job"),
    Case("cursor-not-an-id", lambda r, k: r.hset(k.record, "cursor", "not-an-id"), "job"),
    Case("cursor-ahead", lambda r, k: r.hset(k.record, "cursor", "99999999999999-0"), "job"),
    # (a new revision: a follower reads the record again only then, test_a_record_replaced_...)
    Case("record-not-json", lambda r, k: replaced(r, k, "{x"), "job", "follower"),
    Case("record-1e999", lambda r, k: r.hset(k.record, "record", '{"generation": 1e999}'), "job"),
    Case("ranks-wrong-type", wrong_type(lambda k: k.ranks), "job"),
    Case("head-not-json", lambda r, k: r.hset(k.record, "head", "{x"), "job"),
    Case("lease-inf", lambda r, k: r.zadd(k.leases, {"evil": "+inf"}), "leases"),
    Case("lease-minus-inf", lambda r, k: r.zadd(k.leases, {"evil": "-inf"}), "leases"),
    Case("lease-far-ahead", lambda r, k: r.zadd(k.leases, {"evil": FAR}), "leases"),
    Case("lease-bad-name", lambda r, k: r.zadd(k.leases, {"evil one": 1}), "leases"),
    Case("lease-float", lambda r, k: r.zadd(k.leases, {"evil": 2.5}), "leases"),
    Case("report-gpu-x", phantom("c", node_report("c", gpu="x")), "node", settle=0.5),
    Case("report-gpus-[]", phantom("c", node_report("c", gpu={"gpus": []})), "node", settle=0.5),
    Case(
        "report-drain-false",
        phantom("c", node_report("c", cordon={"reason": "r", "by": "x", "drain": "false"})),
        "node",
        settle=0.5,
    ),
    Case("report-other-name", phantom("c", node_report("d")), "node", settle=0.5),
    Case(
        "report-port-1e999", phantom("c", b'{"name": "c", "free_port": 1e999}'), "node", settle=0.5
    ),
    Case("report-not-utf8", phantom("c", b"\xff\xfe{"), "node", settle=0.5),
    Case("report-nested", phantom("c", b"[" * 100_000), "node", settle=0.5),
    Case(
        "report-no-ttl",
        lambda r, k: (r.set(k.node("c"), node_report("c")), r.zadd(k.leases, {"c": 2**52})),
        "leases",
    ),
    Case(
        "node-key-hash",
        then(
            phantom("c", ""),
            lambda r, k: r.delete(k.node("c")),
            lambda r, k: r.hset(k.node("c"), "x", "y"),
        ),
        "node",
    ),
    Case(
        "cordon-drain-false",
        lambda r, k: r.hset(k.cordons, "b", '{"reason": "r", "by": "x", "drain": "false"}'),
        "cordons",
        "follower",
        repaired=False,
    ),
    Case(
        "cordon-not-json",
        lambda r, k: r.hset(k.cordons, "b", "x"),
        "cordons",
        "follower",
        repaired=False,
    ),
    Case("command-1e999", command('{"type": "scale", "target": 1e999}'), "commands"),
    Case("command-2.9", command('{"type": "scale", "target": 2.9}'), "commands"),
    Case("command-true", command('{"type": "scale", "target": true}'), "commands"),
    Case("command-NaN", command('{"type": "scale", "target": NaN}'), "commands"),
    Case("command-explode", command('{"type": "explode"}'), "commands"),
    Case("command-no-field", lambda r, k: r.xadd(k.commands, {"x": "y"}), "commands"),
    Case("leases-wrong-type", wrong_type(lambda k: k.leases), "leases", "follower"),
    Case("job-wrong-type", wrong_type(lambda k: k.record), "job", "follower"),
    Case("events-wrong-type", wrong_type(lambda k: k.events), "events"),
    Case("commands-wrong-type", wrong_type(lambda k: k.commands), "commands"),
    Case("cordons-wrong-type", wrong_type(lambda k: k.cordons), "cordons", "follower"),
    Case("changes-wrong-type", wrong_type(lambda k: k.changes), "changes"),
    Case("change-seq-abc", lambda r, k: r.set(k.change_seq, "abc"), "changes"),
    Case("digests-wrong-type", wrong_type(lambda k: k.digests), "changes", "follower"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_garbage_is_reported_and_repaired_or_ignored(
    redis_server: RedisServer, job_id: str, case: Case
) -> None:
    job = form(redis_server, job_id)
    case.write(job.raw, job.keys)
    follower = job.follower.sync(report("b"))  # none of these may raise
    status = job.store.snapshot()
    first = job.lead()
    seen = {"leader": first, "follower": follower}[case.seen_by]
    assert case.kind in job.garbage_kinds(seen), seen.garbage
    sample = {"job_id": job_id, "key": case.kind}
    counted = job.metrics.registry.get_sample_value("nodeagent_redis_garbage_total", sample)
    assert status.now_ms > 0
    time.sleep(case.settle)
    for _ in range(3):  # the leader repairs (or skips) it; the job goes on
        after = job.lead()
        follower = job.follower.sync(report("b"))
    if case.repaired:
        assert not after.garbage and not follower.garbage, (after.garbage, follower.garbage)
        assert not job.store.snapshot().garbage
    else:  # still there, still ignored, reported once
        assert case.kind in job.garbage_kinds(follower)
        assert job.follower_counts == [case.kind], job.follower_counts
        assert follower.cordon is None
    if case.seen_by == "leader":  # counted when found, not again while it stays
        assert counted is not None and counted >= 1
        assert job.metrics.registry.get_sample_value("nodeagent_redis_garbage_total", sample) == (
            counted
        )
    record = job.store.snapshot().record
    assert record is not None and record.generation >= 1
    # Writes still work: a command reaches the leader and the cursor moves past it.
    job.store.send_command(Command(CommandType.SCALE, target=3, by="test"))
    assert [c.target for c in job.store.sync(report("a")).commands] == [3]


def test_a_garbage_event_is_appended_once(redis_server: RedisServer, job_id: str) -> None:
    job = form(redis_server, job_id)
    job.raw.zadd(job.keys.leases, {"evil": "+inf"})
    job.raw.zadd(job.keys.leases, {"evil2": "+inf"})
    for _ in range(3):
        job.store.sync(report("a"))  # seen three times, not removed (no commit here)
    events = [e for e in job.store.events() if e.type == "redis_garbage"]
    assert len(events) == 2 and all(e.node == "a" for e in events), events
    assert {e.data["kind"] for e in events} == {"leases"}
    assert "evil" in events[0].message and "removed" in events[0].message


@pytest.mark.parametrize(
    "write",
    [
        lambda r, k: r.set(k.leader, "garbage"),  # unparseable, no TTL
        lambda r, k: r.set(k.leader, "a 7"),  # parseable, no TTL
        lambda r, k: r.set(k.leader, "ghost 7", px=600_000),  # a node that does not exist
        lambda r, k: (r.delete(k.leader), r.hset(k.leader, "x", "y")),  # wrong type
    ],
    ids=["unparseable", "no-ttl", "ghost", "wrong-type"],
)
def test_a_garbage_leader_lease_is_taken_over_within_lease_ttl(
    redis_server: RedisServer, job_id: str, write: Write
) -> None:
    job = form(redis_server, job_id)
    job.raw.delete(job.keys.leader)
    write(job.raw, job.keys)
    ttl = 300
    first = job.follower.sync(report("b", ttl_ms=ttl))
    assert first.leader is None and "leader" in job.garbage_kinds(first)
    assert first.leader_deadline_ms is not None
    assert first.leader_deadline_ms <= first.now_ms + ttl  # not -1, not 10 ms from now for ever
    job.store.snapshot()  # nodeagentctl's read does not raise either
    time.sleep(ttl / 1000 + 0.1)
    second = job.follower.sync(report("b", ttl_ms=ttl))
    assert second.leader_name == "b"


@pytest.mark.parametrize(
    "write",
    [
        lambda r, k: r.set(k.leader_epoch, "abc"),
        lambda r, k: r.set(k.leader_epoch, str(2**62)),
        wrong_type(lambda k: k.leader_epoch),
    ],
    ids=["abc", "huge", "wrong-type"],
)
def test_a_garbage_epoch_restarts_above_every_token(
    redis_server: RedisServer, job_id: str, write: Write
) -> None:
    job = form(redis_server, job_id)
    write(job.raw, job.keys)
    job.raw.delete(job.keys.leader)
    snap = job.follower.sync(report("b"))
    assert snap.leader_name == "b" and "leader-epoch" in job.garbage_kinds(snap)
    assert snap.leader is not None and int(snap.leader.split()[1]) > snap.now_ms - 1000


def test_a_follower_does_not_act_on_a_record_whose_master_is_not_published(
    redis_server: RedisServer, job_id: str
) -> None:
    job = form(redis_server, job_id)
    good = job.follower.sync(report("b")).record
    assert good is not None
    forged = replace(good, master_addr="10.66.66.66")
    replaced(job.raw, job.keys, forged)
    snap = job.follower.sync(report("b"))
    assert snap.stored_record == forged
    assert snap.record == replace(forged, state=JobState.RESTARTING)  # b waits, starts nothing
    assert any("not what a published" in g.problem for g in snap.garbage), snap.garbage
    # The leader sees the contradiction too, and rewrites the record (the job re-forms).
    job.lead()
    after = job.store.snapshot().record
    assert after is not None and after.generation == 2 and after.state is JobState.RESTARTING


def test_a_phantom_master_without_a_live_lease_is_not_acted_on(
    redis_server: RedisServer, job_id: str
) -> None:
    job = form(redis_server, job_id)
    good = job.follower.sync(report("b")).record
    assert good is not None
    forged = replace(good, generation=2, members=("ghost", "b"), master_addr="10.66.66.66")
    replaced(job.raw, job.keys, forged, gen=2)
    snap = job.follower.sync(report("b"))
    assert snap.record is not None and snap.record.state is JobState.RESTARTING
    # Not garbage by itself (a rank 0 that just died looks the same): the leader re-forms.
    job.lead()
    after = job.store.snapshot().record
    assert after is not None and after.state is JobState.RESTARTING and after.generation == 3


def replaced(r: redis.Redis, keys: JobKeys, record: JobRecord | str, **fields: object) -> None:
    """Replace the record by hand at a new revision: a JobRecord as a leader writes it (its
    head and members' digest too: the ranks hash is then stale when the members differ), a
    string as both record and head."""
    if isinstance(record, JobRecord):
        written = {"record": record.to_json(), "head": record.head_json()}
        written["members"] = record.members_digest
    else:
        written = {"record": record, "head": record}
    r.hset(keys.record, mapping={**written, **fields})  # type: ignore[dict-item]
    r.hincrby(keys.record, "rev", 1)


def test_a_record_with_another_nproc_is_reported(redis_server: RedisServer, job_id: str) -> None:
    job = form(redis_server, job_id)
    good = job.follower.sync(report("b")).record
    assert good is not None
    replaced(job.raw, job.keys, replace(good, nproc_per_node=4))
    snap = job.follower.sync(report("b"))
    assert any("nproc_per_node 4 is not this node's 1" in g.problem for g in snap.garbage)


def test_a_record_replaced_at_the_same_revision_is_rewritten_by_the_leader(
    redis_server: RedisServer, job_id: str
) -> None:
    """A follower reads the record again only at a new revision (SYNC does not send 10,000
    nodes a record they hold); the leader reads it every time, so garbage put in its place at
    the same revision is rewritten at a new one, which the follower then reads."""
    job = form(redis_server, job_id)
    good = job.follower.sync(report("b")).record
    assert good is not None
    job.raw.hset(job.keys.record, "record", "{x")
    assert job.follower.sync(report("b")).record == good  # still the one it holds
    assert job.lead().record_error is not None
    job.lead()
    snap = job.follower.sync(report("b"))
    assert snap.rev > 1 and snap.record is not None and not snap.garbage, snap


def test_store_writes_on_a_key_of_the_wrong_type_say_so(
    redis_server: RedisServer, job_id: str
) -> None:
    from nodeagent.errors import CorruptStateError

    job = form(redis_server, job_id)
    wrong_type(lambda k: k.commands)(job.raw, job.keys)
    with pytest.raises(CorruptStateError, match="wrong type"):
        job.store.send_command(Command(CommandType.RESTART))
