"""JobStore and its Lua scripts against a real redis-server: leases, leadership, fencing, and
what a nodeagentctl wait reads from them."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from nodeagent.cli.ctl.wait import wait_job_drained, wait_scaled
from nodeagent.coord.client import connect, parse_sentinel_url
from nodeagent.coord.keys import JobKeys
from nodeagent.coord.store import JobStore
from nodeagent.errors import ConfigError, CoordinationError, FencedError
from nodeagent.job.plan import LeaderMemory, Plan
from nodeagent.model.job import Command, CommandType, Event, JobRecord, NodeReport
from nodeagent.state import JobState, NodeState
from tests.helpers.cluster import RedisServer, free_port
from tests.helpers.factories import make_record


def store_for(server: RedisServer, job: str) -> JobStore:
    return JobStore(connect(server.url, 2.0), JobKeys("nodeagent", job))


def report(name: str, ttl_ms: int = 1000, acked: int = 0) -> NodeReport:
    return NodeReport(
        name=name,
        address="127.0.0.1",
        state=NodeState.READY,
        acked_generation=acked,
        free_port=1,
        lease_ttl_ms=ttl_ms,
    )


def job_record(gen: int, state: JobState = JobState.RESTARTING) -> JobRecord:
    return make_record(state, gen, target_nodes=2, max_nodes=3)


def write(
    record: JobRecord | None, reap: tuple[str, ...] = (), events: tuple[Event, ...] = ()
) -> Plan:
    return Plan(record=record, events=events, reap=reap, memory=LeaderMemory(), reason="test")


def test_first_node_leads_and_others_follow(redis_server: RedisServer, job_id: str) -> None:
    store = store_for(redis_server, job_id)
    first = store.sync(report("a"))
    second = store.sync(report("b"))
    assert first.leader_name == "a" and second.leader_name == "a"
    assert first.leases and not second.leases  # only the leader reads the whole cluster
    again = store.sync(report("a"))
    assert again.leader == first.leader  # renewed, same token
    names = {lease.name for lease in again.leases}
    assert names == {"a", "b"}
    assert all(lease.deadline_ms > again.now_ms for lease in again.leases)


def test_followers_learn_when_the_leader_lease_lapses(
    redis_server: RedisServer, job_id: str
) -> None:
    store = store_for(redis_server, job_id)
    store.sync(report("a", ttl_ms=1000))
    time.sleep(0.3)
    follower = store.sync(report("b", ttl_ms=1000))
    assert follower.leader_deadline_ms is not None
    # Set by a's renewal 0.3 s earlier, not by b's own heartbeat.
    assert follower.now_ms < follower.leader_deadline_ms <= follower.now_ms + 750
    assert store.snapshot().leader_deadline_ms is None


def test_every_key_of_a_job_shares_one_hash_tag(redis_server: RedisServer, job_id: str) -> None:
    store = store_for(redis_server, job_id)
    snap = store.sync(report("a"), [Event("hello")])
    assert snap.leader is not None
    store.commit(snap.leader, snap.rev, write(job_record(1)))
    store.send_command(Command(CommandType.RESTART))
    keys = redis_server.client().keys(f"*{job_id}*")
    # node, leases, leader, epoch, job, ranks, events, commands, wake, changes (3)
    assert len(keys) == 12
    assert all(f"{{{job_id}}}" in key for key in keys)


def test_stale_leader_is_fenced_after_its_lease_expires(
    redis_server: RedisServer, job_id: str
) -> None:
    store = store_for(redis_server, job_id)
    old = store.sync(report("a", ttl_ms=200))
    assert old.leader is not None
    time.sleep(0.3)  # a's leader lease expires; b takes over with a higher token
    new = store.sync(report("b", ttl_ms=5000))
    assert new.leader_name == "b"
    assert int(new.leader.split()[1]) > int(old.leader.split()[1])  # type: ignore[union-attr]
    with pytest.raises(FencedError, match="leader lease"):
        store.commit(old.leader, old.rev, write(job_record(1)))
    assert store.commit(new.leader, new.rev, write(job_record(1))) == 1  # type: ignore[arg-type]


def test_a_deposed_leader_is_fenced_and_a_moved_lease_is_never_taken(
    redis_server: RedisServer, job_id: str
) -> None:
    """DEPOSE (job/peers.py): the lease goes to the caller only while it holds the value the
    caller read; the deposed leader's writes are refused from then on."""
    store = store_for(redis_server, job_id)
    old = store.sync(report("a", ttl_ms=60_000))
    assert old.leader is not None
    event = Event("leader_deposed", node="a", message="held out")
    assert not store.depose("b", "a 999999", 60_000, event)  # not the lease's value
    assert store.depose("b", old.leader, 60_000, event)
    new = store.sync(report("b", ttl_ms=60_000))
    assert new.leader_name == "b"
    assert int(new.leader.split()[1]) > int(old.leader.split()[1])  # type: ignore[union-attr]
    with pytest.raises(FencedError, match="leader lease"):
        store.commit(old.leader, old.rev, write(job_record(1)))
    assert not store.depose("c", old.leader, 60_000, event)  # it moved: b keeps it
    assert store.sync(report("a", ttl_ms=60_000)).leader_name == "b"
    assert [e.type for e in store.events()][-1:] == ["leader_deposed"]


def test_record_writes_are_compare_and_set(redis_server: RedisServer, job_id: str) -> None:
    store = store_for(redis_server, job_id)
    snap = store.sync(report("a", ttl_ms=5000))
    leader = snap.leader
    assert leader is not None
    rev = store.commit(leader, snap.rev, write(job_record(3)))
    with pytest.raises(FencedError, match="revision"):
        store.commit(leader, snap.rev, write(job_record(4)))  # read before the last write
    with pytest.raises(FencedError, match="older"):
        store.commit(leader, rev, write(job_record(2)))  # generations never go back
    assert store.commit(leader, rev, write(job_record(4))) == rev + 1
    assert store.snapshot().record == job_record(4)


def test_reaping_is_refused_when_the_lease_was_renewed(
    redis_server: RedisServer, job_id: str
) -> None:
    store = store_for(redis_server, job_id)
    leader_snap = store.sync(report("a", ttl_ms=5000))
    store.sync(report("b", ttl_ms=5000))
    assert leader_snap.leader is not None
    with pytest.raises(FencedError, match="renewed"):
        store.commit(leader_snap.leader, leader_snap.rev, write(None, reap=("b",)))


def test_reaping_an_expired_node(redis_server: RedisServer, job_id: str) -> None:
    store = store_for(redis_server, job_id)
    store.sync(report("b", ttl_ms=100))
    time.sleep(0.2)
    snap = store.sync(report("a", ttl_ms=5000))
    # b led first; its leader lease expired with its node lease, so a leads now
    assert snap.leader_name == "a"
    view = snap.cluster_view()
    assert view.expired == ("b",) and set(view.nodes) == {"a"}
    lost = Event("node_lost", node="b")
    store.commit(snap.leader, snap.rev, write(None, reap=("b",), events=(lost,)))  # type: ignore[arg-type]
    after = store.sync(report("a", ttl_ms=5000))
    assert [lease.name for lease in after.leases] == ["a"]
    assert store.events_tail(1)[0].type == "node_lost"


def test_garbage_in_redis_is_reported_and_overwritten(
    redis_server: RedisServer, job_id: str
) -> None:
    store = store_for(redis_server, job_id)
    client = redis_server.client()
    client.hset(store.keys.record, mapping={"rev": 3, "gen": 5, "record": "{not json"})
    client.set(store.keys.node("x"), "garbage", px=5000)
    client.zadd(store.keys.leases, {"x": int(client.time()[0]) * 1000 + 4000})
    snap = store.sync(report("a", ttl_ms=5000))
    assert snap.record is None and snap.record_error and "not JSON" in snap.record_error
    assert any("node report" in e for e in snap.errors)
    assert "x" not in snap.cluster_view().nodes  # an unreadable node counts as absent
    assert snap.leader is not None
    store.commit(snap.leader, snap.rev, write(job_record(6)), replacing_garbage=True)
    assert store.snapshot().record == job_record(6)


def test_leave_drops_lease_and_leadership(redis_server: RedisServer, job_id: str) -> None:
    store = store_for(redis_server, job_id)
    store.sync(report("a", ttl_ms=60_000))
    store.leave("a", Event("node_left", node="a"))
    snap = store.snapshot()
    assert snap.leader is None and snap.leases == ()
    assert store.sync(report("b")).leader_name == "b"  # no waiting for a TTL


def test_commands_reach_the_leader_once(redis_server: RedisServer, job_id: str) -> None:
    store = store_for(redis_server, job_id)
    store.send_command(Command(CommandType.SCALE, target=2, by="ops"))
    redis_server.client().xadd(store.keys.commands, {"command": "garbage"})
    snap = store.sync(report("a", ttl_ms=5000))
    assert [c.type for c in snap.commands] == [CommandType.SCALE]
    assert snap.command_cursor is not None and any("skipped" in e for e in snap.errors)
    record = replace(job_record(1), command_cursor=snap.command_cursor)
    store.commit(snap.leader, snap.rev, write(record))  # type: ignore[arg-type]
    assert store.sync(report("a", ttl_ms=5000)).commands == ()


def test_unreachable_redis_fails_fast() -> None:
    store = JobStore(connect(f"redis://127.0.0.1:{free_port()}/0", 0.5), JobKeys("nodeagent", "x"))
    started = time.monotonic()
    with pytest.raises(CoordinationError, match="ConnectionError"):
        store.sync(report("a"))
    assert time.monotonic() - started < 5  # a bound on a hang, not a performance target


def test_sentinel_urls() -> None:
    target = parse_sentinel_url("redis+sentinel://:s3cret@s1:26379,s2:26380/mymaster/2")
    assert target.hosts == (("s1", 26379), ("s2", 26380))
    assert (target.service, target.db, target.password, target.tls) == (
        "mymaster",
        2,
        "s3cret",
        False,
    )
    tls = parse_sentinel_url("rediss+sentinel://s1/m?ssl_ca_certs=/etc/ca.pem")
    assert tls.tls and tls.ca_certs == "/etc/ca.pem" and tls.hosts == (("s1", 26379),)
    with pytest.raises(ConfigError, match="sentinel URL looks like"):
        parse_sentinel_url("redis+sentinel://s1:26379")


def test_drain_wait_returns_once_the_job_went_on_without_the_node(
    redis_server: RedisServer, job_id: str
) -> None:
    """`nodeagentctl drain --wait` (cli/ctl/wait.py) on what the store holds: b is cordoned with
    its workers stopped before the leader announces the generation without it, and before b's
    agent persisted and handed over its last save (it acknowledges that generation only after):
    the wait goes on while the record names b, restarting or not, and ends once it does not."""
    store = store_for(redis_server, job_id)
    store.sync(replace(report("b", ttl_ms=30_000), state=NodeState.CORDONED))
    rev = 0

    def lead(state: JobState, generation: int, members: tuple[str, ...]) -> None:
        """a, rank 0, acknowledged `generation`; its leader writes the record."""
        nonlocal rev
        snap = store.sync(report("a", ttl_ms=30_000, acked=generation))
        assert snap.leader is not None
        at = {"master_addr": "127.0.0.1", "master_port": 1}
        rev = store.commit(snap.leader, rev, write(make_record(state, generation, members, **at)))

    lead(JobState.RUNNING, 1, ("a", "b"))
    assert wait_job_drained(store, "b", 0.5) == 1  # not announced yet
    lead(JobState.RESTARTING, 2, ("a", "b"))
    assert wait_job_drained(store, "b", 0.5) == 1  # b has not acknowledged yet
    lead(JobState.RUNNING, 2, ("a",))
    assert wait_job_drained(store, "b", 10) == 0


def test_scale_wait_ends_when_the_job_ends_first(
    redis_server: RedisServer, job_id: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`nodeagentctl scale N --wait` on a job that ends before it runs on N nodes (its ranks
    finished first) says so at once instead of waiting out its timeout."""
    store = store_for(redis_server, job_id)
    snap = store.sync(report("a", ttl_ms=30_000, acked=1))
    assert snap.leader is not None
    at = {"master_addr": "127.0.0.1", "master_port": 1}
    store.commit(snap.leader, 0, write(make_record(JobState.SUCCEEDED, 1, ("a", "b"), **at)))
    started = time.monotonic()
    assert wait_scaled(store, 1, 60) is False
    assert time.monotonic() - started < 30  # it did not wait out its 60 s
    assert f"job {job_id} succeeded before it ran on 1 nodes" in capsys.readouterr().err
