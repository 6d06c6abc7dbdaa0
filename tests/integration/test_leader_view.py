"""The leader reads what changed, not every report (coord/view.py), against a real redis-server
with 1,500 nodes: more than one page, and a leases zset too big to be swept at once."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any

import redis

from nodeagent.coord.bounded import unbounded
from nodeagent.coord.client import connect
from nodeagent.coord.keys import JobKeys, PoolKeys
from nodeagent.coord.pool import PLACEMENTS_REREAD, PoolStore, PoolWrite
from nodeagent.coord.store import JobStore
from nodeagent.coord.view import PAGE, SWEEP
from nodeagent.job import stalls
from nodeagent.job.leadership import Leadership
from nodeagent.job.plan import Policy
from nodeagent.model.job import Event, GpuInfo, GpuSummary, NodeReport
from nodeagent.model.pool import PoolNode
from nodeagent.model.spec import JobSpec, load_spec
from nodeagent.model.stalls import RankStall
from nodeagent.pool.leadership import NodeViews, read_view
from nodeagent.state import NodeState
from nodeagent.telemetry.metrics import AgentMetrics
from tests.helpers.cluster import RedisServer

M = 1500
TTL = 60_000


def report(name: str, **changes: object) -> NodeReport:
    base = NodeReport(
        name=name, address="10.0.0.1", state=NodeState.READY, free_port=1, lease_ttl_ms=TTL
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def fleet(server: RedisServer, job: str) -> tuple[JobStore, JobStore, redis.Redis, JobKeys]:
    """`a` leads; M - 1 other nodes have beaten once."""
    keys = JobKeys("nodeagent", job)
    leader = JobStore(connect(server.url, 5.0), keys)
    assert leader.sync(report("a")).leader_name == "a"
    others = JobStore(connect(server.url, 5.0), keys)
    others.sync_many([report(f"n{i:04d}") for i in range(1, M)])
    return leader, others, server.client(), keys


def names(snapshot_leases: object) -> set[str]:
    return {lease.name for lease in snapshot_leases}  # type: ignore[attr-defined]


def test_the_leader_reads_everything_once_then_only_what_changed(
    redis_server: RedisServer, job_id: str
) -> None:
    leader, others, _, _ = fleet(redis_server, job_id)
    first = leader.sync(report("a"))
    assert len(first.leases) == M and leader.last_pages >= M // PAGE
    # Nothing changed: one sweep's slice (ZSCAN's COUNT is a hint) and no further page.
    others.sync_many([report(f"n{i:04d}") for i in range(1, M)])
    steady = leader.sync(report("a"))
    assert len(steady.leases) == M and leader.last_pages == 1
    assert leader.last_read <= 3 * SWEEP, leader.last_read
    # A GPU's temperature is no change to plan from; its verdict is.
    warm = GpuSummary(True, gpus=(GpuInfo(0, "ok", "none", "", temperature_c=70.0),))
    others.sync_many([report("n0007", gpu=warm)])
    others.sync_many(
        [report("n0007", gpu=replace(warm, gpus=(replace(warm.gpus[0], temperature_c=71.0),)))]
    )
    bad = replace(warm, gpus=(replace(warm.gpus[0], health="bad"),))
    others.sync_many([report("n0008", gpu=bad)])
    seen = leader.sync(report("a"))
    lease = seen.lease("n0008")
    assert lease is not None and lease.report is not None and lease.report.gpu == bad
    assert all(lease.deadline_ms > seen.now_ms for lease in seen.leases)
    assert leader.last_read <= 3 * SWEEP + 2


def test_a_node_that_leaves_is_gone_from_the_view(redis_server: RedisServer, job_id: str) -> None:
    leader, others, _, _ = fleet(redis_server, job_id)
    leader.sync(report("a"))
    others.leave("n0042", Event("node_left", node="n0042"))
    after = leader.sync(report("a"))
    assert "n0042" not in names(after.leases) and len(after.leases) == M - 1


def test_an_expired_lease_is_exact_and_read_without_a_change(
    redis_server: RedisServer, job_id: str
) -> None:
    leader, _, raw, keys = fleet(redis_server, job_id)
    leader.sync(report("a"))
    raw.zadd(keys.leases, {"n0100": 1000})  # its deadline passed long ago
    view = leader.sync(report("a")).cluster_view()
    assert "n0100" in view.expired and "n0100" not in view.nodes
    assert len(view.nodes) == M - 1


def test_a_lost_change_set_is_read_again_in_full(redis_server: RedisServer, job_id: str) -> None:
    leader, others, raw, keys = fleet(redis_server, job_id)
    leader.sync(report("a"))
    raw.delete(keys.changes, keys.change_seq, keys.digests)
    others.sync_many([report(f"n{i:04d}") for i in range(1, M)])  # each marks itself again
    others.sync_many([report("n0005", state=NodeState.JOINING)])
    again = leader.sync(report("a"))
    assert leader.last_read >= M - 1 and len(again.leases) == M
    lease = again.lease("n0005")
    assert lease is not None and lease.report is not None
    assert lease.report.state is NodeState.JOINING


def test_a_lease_no_change_announced_is_found_by_the_sweep(
    redis_server: RedisServer, job_id: str
) -> None:
    leader, _, raw, keys = fleet(redis_server, job_id)
    leader.sync(report("a"))
    raw.set(keys.node("ghost"), report("ghost").to_json(), px=TTL)
    raw.zadd(keys.leases, {"ghost": 10**15})  # no change marked, a deadline far beyond its TTL

    def dropped() -> bool:
        drop = leader.sync(report("a")).drop
        return ("ghost", str(10**15)) in {(n, s.split(".")[0]) for n, s in drop}

    # Neither a change (none was marked) nor the expired leases (its deadline is far ahead)
    # name it: only the sweep can. (Which slice it falls in is ZSCAN's order: any, the first too.)
    assert raw.zscore(keys.changes, "ghost") is None
    found = next((beat for beat in range(3 * M // SWEEP) if dropped()), None)
    assert found is not None, "the sweep never read the phantom lease"


def pool_node(name: str, **changes: object) -> PoolNode:
    return replace(PoolNode(name, "10.0.0.1", TTL), **changes)  # type: ignore[arg-type]


def test_the_pool_leader_reads_what_changed(redis_server: RedisServer, job_id: str) -> None:
    store = PoolStore(connect(redis_server.url, 5.0), PoolKeys("nodeagent", job_id))
    beat = store.sync(pool_node("a"))
    token = beat.leader
    assert token is not None and beat.leader_name == "a"
    store.sync_many([pool_node(f"n{i:04d}") for i in range(1, M)])
    assert len(store.read(token).nodes) == M and store.last_read >= M
    store.sync_many([pool_node(f"n{i:04d}") for i in range(1, M)])
    store.sync_many([pool_node("n0009", serving="train")])
    snap = store.read(token)
    assert len(snap.nodes) == M and snap.nodes["n0009"].serving == "train"
    assert store.last_read <= 3 * SWEEP + 1, store.last_read
    # What an operator reads: every node, each time.
    other = PoolStore(connect(redis_server.url, 5.0), PoolKeys("nodeagent", job_id))
    assert other.read().nodes == snap.nodes and other.last_read == 0


def test_the_pool_leader_keeps_the_placements_it_writes(
    redis_server: RedisServer, job_id: str
) -> None:
    keys = PoolKeys("nodeagent", job_id)
    store = PoolStore(connect(redis_server.url, 5.0), keys)
    token = store.sync(pool_node("a")).leader
    assert token is not None
    raw = redis_server.client()
    raw.hset(keys.placements, "a", "one")
    assert store.read(token).placements == {"a": "one"}  # a new term reads them
    store.commit(token, PoolWrite(unplace=("a",), place={"b": "two"}))
    raw.hset(keys.placements, "c", "three")  # by hand: not what this leader wrote
    assert store.read(token).placements == {"b": "two"}
    for _ in range(PLACEMENTS_REREAD):
        store.read(token)
    assert store.read(token).placements == {"b": "two", "c": "three"}  # read again in full
    assert store.read().placements == {"b": "two", "c": "three"}  # an operator reads them


def test_the_leader_wakes_at_the_earliest_real_deadline(
    redis_server: RedisServer, job_id: str
) -> None:
    """Not at the lower bounds the view holds for leases it did not read again, which lie
    ahead of now but before the real deadlines (it would wake again and again)."""
    leader, others, raw, keys = fleet(redis_server, job_id)
    leader.sync(report("a"))
    time.sleep(0.2)
    others.sync_many([report(f"n{i:04d}") for i in range(1, M)])  # renewed, not re-read
    snap = leader.sync(report("a"))
    lowest = min(lease.deadline_ms for lease in snap.leases)
    first: Any = raw.zrange(keys.leases, 0, 0, withscores=True)
    earliest = float(first[0][1])
    assert lowest < earliest  # the view's bounds lie before the real deadlines
    policy = Policy(1, M, M, 1, 0, join_settle_ms=0, rendezvous_timeout_ms=60_000)
    clock = [100.0]
    leadership = Leadership(
        leader, policy, AgentMetrics(job_id), TTL / 1000, lambda: clock[0], unbounded
    )
    assert snap.leader is not None
    leadership.lead(snap.leader, snap)
    assert leadership.next_expiry is not None
    woken_ms = snap.now_ms + (leadership.next_expiry - clock[0]) * 1000
    assert abs(woken_ms - earliest) <= 10, (woken_ms, earliest)


def test_a_spec_is_decoded_again_only_when_its_text_changes(
    redis_server: RedisServer, job_id: str
) -> None:
    keys = PoolKeys("nodeagent", job_id)
    store = PoolStore(connect(redis_server.url, 5.0), keys)
    spec = {"id": "one", "entrypoint": ["python", "t.py"], "user": "u", "min_nodes": 1}
    store.submit(load_spec(spec))
    first = store.specs(["one"])["one"]
    assert isinstance(first, JobSpec) and store.specs(["one"])["one"] is first  # kept
    raw = redis_server.client()
    stored = raw.hget(keys.specs, "one")
    assert stored is not None
    raw.hset(keys.specs, "one", json.dumps({**json.loads(stored), "priority": 3}))
    again = store.specs(["one"])["one"]
    assert isinstance(again, JobSpec) and again.priority == 3
    raw.hset(keys.specs, "one", "{x")
    garbage = store.specs(["one"])["one"]
    assert isinstance(garbage, str) and "not JSON" in garbage, garbage


def test_a_spec_kept_is_kept_whatever_was_read_between(
    redis_server: RedisServer, job_id: str
) -> None:
    """The API service's views read their own jobs' specs through one store: a listing of
    every job, then one job's, must not make the listing decode every spec again."""
    store = PoolStore(connect(redis_server.url, 5.0), PoolKeys("nodeagent", job_id))
    names = [f"job-{i}" for i in range(5)]
    for name in names:
        store.submit(load_spec({"id": name, "entrypoint": ["true"], "user": "u"}))
    listing = store.specs(names)
    assert store.specs(["job-0"])["job-0"] is listing["job-0"]
    again = store.specs(names)
    assert all(again[name] is listing[name] for name in names)


def test_the_leader_reads_again_soon_while_a_member_lists_a_stalled_rank(
    redis_server: RedisServer, job_id: str
) -> None:
    """job/stalls.py: the members' lists come in one by one with no event to wake the leader,
    so while any report lists a rank it reads again every POLL_S; a healthy job, not at all."""
    keys = JobKeys("nodeagent", job_id)
    leader = JobStore(connect(redis_server.url, 5.0), keys)
    other = JobStore(connect(redis_server.url, 5.0), keys)
    assert leader.sync(report("a")).leader_name == "a"
    other.sync(report("b"))
    snap = leader.sync(report("a"))
    assert snap.leader is not None and set(snap.cluster_view().nodes) == {"a", "b"}
    policy = Policy(1, 2, 2, 1, 0, join_settle_ms=0, rendezvous_timeout_ms=60_000)
    clock = [100.0]
    leadership = Leadership(
        leader, policy, AgentMetrics(job_id), TTL / 1000, lambda: clock[0], unbounded
    )
    leadership.lead(snap.leader, snap)
    assert leadership.next_poll is None
    other.sync(report("b", stalls=(RankStall(0, 12, waiting=True, asleep=True),)))
    snap = leader.sync(report("a"))
    assert snap.leader is not None
    leadership.lead(snap.leader, snap)
    assert leadership.next_poll == clock[0] + stalls.POLL_S


def test_a_jobs_view_is_made_and_vouched_for_again_only_when_the_job_changed(
    redis_server: RedisServer, job_id: str
) -> None:
    """The pool leader's rounds at 10,000 pending jobs: each job's view kept from the last
    round (its spec not vouched for again) while its status, spec, cancel, hold and requeue
    are what they were; a job held since gets a view that says so."""
    keys = PoolKeys("nodeagent", job_id)
    store = PoolStore(connect(redis_server.url, 5.0), keys)
    token = store.sync(pool_node("a")).leader
    assert token is not None
    for name in ("one", "two"):
        store.submit(load_spec({"id": name, "entrypoint": ["true"], "user": "u"}))
    asked: list[str] = []

    def vouch(spec: JobSpec) -> str | None:
        asked.append(spec.id)
        return None

    kept = NodeViews()
    _, first, _, _ = read_view(store, token, kept, vouch)
    assert sorted(asked) == ["one", "two"]
    asked.clear()
    _, again, _, _ = read_view(store, token, kept, vouch)
    assert asked == [] and all(again.jobs[j] is first.jobs[j] for j in ("one", "two"))
    redis_server.client().hset(keys.holds, "two", "alice")
    _, held, _, _ = read_view(store, token, kept, vouch)
    assert asked == ["two"] and held.jobs["one"] is first.jobs["one"]
    assert held.jobs["two"].held == "alice" and first.jobs["two"].held is None


def test_a_read_of_the_nodes_alone_reads_no_job_and_keeps_what_was_decoded(
    redis_server: RedisServer, job_id: str
) -> None:
    """The nodes listing at 10,000 jobs: their statuses are not read; the statuses decoded
    before are still kept for the next whole read."""
    store = PoolStore(connect(redis_server.url, 5.0), PoolKeys("nodeagent", job_id))
    store.sync(pool_node("a"))
    store.submit(load_spec({"id": "one", "entrypoint": ["true"], "user": "u"}))
    before = store.read().jobs["one"]
    nodes_only = store.read(jobs=False)
    assert nodes_only.jobs == {} and set(nodes_only.nodes) == {"a"}
    assert store.read().jobs["one"] is before  # decoded once
