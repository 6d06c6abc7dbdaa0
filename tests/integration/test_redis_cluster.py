"""Decision 1 on a real Redis Cluster: each job's keys in its own slot, jobs spread over nodes.

Three cluster-enabled redis-servers on loopback (tests/helpers/rediscluster.py), reached
through a redis+cluster:// URL naming them as seeds.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from nodeagent.config.redisurl import problem
from nodeagent.coord.client import check_credentials, connect, parse_cluster_url
from nodeagent.coord.cluster import ClusterUnreachableError
from nodeagent.coord.failure import RedisFailure, classify
from nodeagent.coord.keys import JobKeys
from nodeagent.coord.store import JobStore
from nodeagent.errors import ConfigError, CoordinationError
from nodeagent.job.plan import LeaderMemory, Plan
from nodeagent.model.job import Command, CommandType, Cordon, Event, NodeReport
from nodeagent.state import JobState, NodeState
from tests.helpers.cluster import RedisServer, free_port, local_cluster, nodeagentctl, wait_for
from tests.helpers.factories import make_record
from tests.helpers.pool import pool_cluster
from tests.helpers.rediscluster import (
    RedisClusterServers,
    port_for_later,
    redis_cluster,
    self_signed,
)
from tests.helpers.training import check_history, latest_step, training_entrypoint

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    """One cluster for the module (about 2 s to form); tests keep apart by job id."""
    with redis_cluster(tmp_path_factory.mktemp("redis-cluster")) as servers:
        yield servers


def owner_port(servers: RedisClusterServers, job: str) -> int:
    """The port of the primary serving `job`'s slot, as the cluster itself says."""
    with redis.Redis(
        "127.0.0.1", servers.ports[0], decode_responses=True, **servers.options()
    ) as client:
        key = JobKeys("nodeagent", job).record
        slot = int(client.execute_command("CLUSTER", "KEYSLOT", key))
        assert slot == key_slot(key.encode())  # redis-py routes by the same slot
        ranges: Any = client.execute_command("CLUSTER", "SLOTS")
    return next(int(r[2][1]) for r in ranges if int(r[0]) <= slot <= int(r[1]))


def jobs_on_two_nodes(servers: RedisClusterServers, base: str) -> tuple[str, str]:
    """Two job ids starting with `base` whose slots two different primaries serve."""
    first = f"{base}-a"
    for n in range(100):
        second = f"{base}-b{n}"
        if owner_port(servers, second) != owner_port(servers, first):
            return first, second
    raise AssertionError("no job id with a slot on another node in 100 tries")


def report(name: str) -> NodeReport:
    return NodeReport(
        name=name,
        address="127.0.0.1",
        state=NodeState.READY,
        acked_generation=0,
        free_port=1,
        lease_ttl_ms=5000,
    )


@pytest.mark.parametrize(
    ("url", "wanted"),
    [
        ("redis+cluster://h1:7000,h2:7001/", None),
        ("redis+cluster://h1,h2", None),  # ports default to 6379
        ("rediss+cluster://u:p@h1:7000,[::1]:7001/0?ssl_ca_certs=/ca.pem", None),
        ("redis+cluster://h1:7000/3", "only database 0"),
        ("redis+cluster://h1:7000/?db=2", "only database 0"),
        ("redis+cluster://h1:7000/?timeout=3", "takes no option 'timeout'"),
        ("redis+cluster://h1:x/", "bad cluster node address 'h1:x'"),
        ("redis+cluster://h1:7000,,h2/", "bad cluster node address ''"),
        ("redis+cluster:///", "names one or more of its nodes"),
        ("redis://[::1/0", "not a URL"),
    ],
)
def test_cluster_urls_are_checked(url: str, wanted: str | None) -> None:
    found = problem(url)
    assert (found is None) if wanted is None else (found is not None and wanted in found), found


def test_cluster_urls_are_parsed() -> None:
    target = parse_cluster_url(
        "rediss+cluster://op:s%40cret@h1:7000,[::1]:7001,h3/0?ssl_ca_certs=/c"
    )
    assert target.hosts == (("h1", 7000), ("::1", 7001), ("h3", 6379))
    assert (target.username, target.password, target.tls, target.ca_certs) == (
        "op",
        "s@cret",
        True,
        "/c",
    )
    with pytest.raises(ConfigError, match="only database 0"):
        parse_cluster_url("redis+cluster://h1:7000/1")


def test_two_jobs_live_in_slots_of_different_nodes(
    cluster: RedisClusterServers, job_id: str
) -> None:
    one, two = jobs_on_two_nodes(cluster, job_id)
    client = connect(cluster.url, 2.0, "nodeagent-test")
    for job in (one, two):
        store = JobStore(client, JobKeys("nodeagent", job))
        snap = store.sync(report("a"), [Event("hello")])
        assert snap.leader_name == "a" and store.sync(report("b")).leader_name == "a"
        assert snap.leader is not None
        record = make_record(JobState.RESTARTING, 1, target_nodes=2, max_nodes=3)
        plan = Plan(record=record, events=(), reap=(), memory=LeaderMemory(), reason="test")
        store.commit(snap.leader, snap.rev, plan)
        assert store.snapshot().record == record
        store.cordon("b", Cordon("disk", "test", drain=True))  # MULTI/EXEC on one node
        assert store.cordons() == {"b": Cordon("disk", "test", drain=True)}
        assert store.uncordon("b", "test") and not store.uncordon("b", "test")
        assert [e.type for e in store.events()] == [
            "hello",
            "node_drained",
            "node_uncordoned",
            "node_uncordoned",
        ]
        last = store.last_event_id()
        store.send_command(Command(CommandType.RESTART))
        woken = store.wait_events({store.keys.events: last, store.keys.commands: "0-0"}, 2000)
        assert [stream for stream, _, _ in woken] == [store.keys.commands]
    pipe = client.pipeline(transaction=False)  # several jobs' slots, as the pool reads records
    for job in (one, two):
        pipe.hget(JobKeys("nodeagent", job).record, "record")
    assert all(isinstance(raw, str) for raw in pipe.execute(raise_on_error=False))
    for job in (one, two):  # all of a job's keys on the node serving its slot, none elsewhere
        owner = owner_port(cluster, job)
        for port in cluster.ports:
            with redis.Redis(port=port, decode_responses=True) as node:
                keys = node.keys(f"*{{{job}}}*")
                names = [c["name"] for c in node.client_list()]
            assert bool(keys) == (port == owner), (job, port, keys)
            assert port != owner or "nodeagent-test" in names, names  # CLIENT SETNAME there
    client.close()


def test_a_job_runs_on_a_tls_cluster(tmp_path: Path, job_id: str) -> None:
    """rediss+cluster://: TLS to every node the client finds, with the URL's CA."""
    with redis_cluster(tmp_path, tls=self_signed(tmp_path)) as servers:
        assert servers.url.startswith("rediss+cluster://") and "ssl_ca_certs=" in servers.url
        client = connect(servers.url, 2.0)
        check_credentials(client)
        one, two = jobs_on_two_nodes(servers, job_id)
        for job in (one, two):
            store = JobStore(client, JobKeys("nodeagent", job))
            assert store.sync(report("a")).leader_name == "a"
            store.cordon("a", Cordon("disk", "test"))
            assert store.snapshot().leader_name == "a" and "a" in store.cordons()
        client.close()


def test_a_plain_url_to_a_cluster_node_is_a_configuration_error(
    cluster: RedisClusterServers,
) -> None:
    client = connect(f"redis://127.0.0.1:{cluster.ports[0]}/0", 2.0)
    with pytest.raises(ConfigError, match=r"Redis Cluster node: write the URL as redis\+cluster"):
        check_credentials(client)
    client.close()
    fine = connect(cluster.url, 2.0)
    check_credentials(fine)  # the cluster URL is fine
    fine.close()


def test_a_cluster_url_to_a_plain_redis_is_a_configuration_error(
    redis_server: RedisServer,
) -> None:
    client = connect(f"redis+cluster://127.0.0.1:{redis_server.port}/", 2.0)
    with pytest.raises(ConfigError, match="not a cluster node"):
        check_credentials(client)


def test_refused_credentials_and_acls_are_configuration_errors(
    cluster: RedisClusterServers,
) -> None:
    for port in cluster.ports:  # ACLs are per node: a cluster does not share them
        with redis.Redis(port=port) as node:
            node.acl_setuser(
                "agent", enabled=True, passwords=["+agent-secret"], keys=["*"], commands=["+@all"]
            )
            node.acl_setuser(
                "no-slots",
                enabled=True,
                passwords=["+no-slots-secret"],
                keys=["*"],
                commands=["+@all", "-cluster|slots"],
            )
    hosts = ",".join(f"127.0.0.1:{p}" for p in cluster.ports)
    wrong = connect(f"redis+cluster://agent:wrong@{hosts}/", 2.0)
    with pytest.raises(ConfigError, match="refused the credentials"):
        check_credentials(wrong)
    with pytest.raises(CoordinationError) as refused:  # as nodeagentctl sees it
        JobStore(wrong, JobKeys("nodeagent", "x")).snapshot()
    assert classify(refused.value) is RedisFailure.CREDENTIALS
    with pytest.raises(ConfigError, match=r"\+cluster\|slots"):
        check_credentials(connect(f"redis+cluster://no-slots:no-slots-secret@{hosts}/", 2.0))
    client = connect(f"redis+cluster://agent:agent-secret@{hosts}/", 2.0)
    check_credentials(client)
    assert client.acl_whoami() == "agent"
    client.close()


def test_an_unreachable_cluster_fails_as_unreachable_redis(tmp_path: Path) -> None:
    """No node answering, nodes that serve no slot yet (a cluster being created), every node
    gone under a running client: each a CoordinationError the agent retries, never one of
    redis-py's own exceptions that are no RedisError (which would end the agent)."""
    down = JobStore(connect(f"redis+cluster://127.0.0.1:{free_port()}/", 0.5), JobKeys("n", "x"))
    check_credentials(down.client)  # no error: the agent retries
    with pytest.raises(CoordinationError, match="cannot reach a node") as raised:
        down.sync(report("a"))
    assert classify(raised.value) is RedisFailure.UNREACHABLE
    servers = RedisClusterServers(tmp_path)
    servers.start_nodes()
    try:
        store = JobStore(connect(servers.url, 0.5), JobKeys("nodeagent", "gone"))
        with pytest.raises(CoordinationError) as unformed:
            store.sync(report("a"))
        assert classify(unformed.value) is RedisFailure.UNREACHABLE, unformed.value
        servers.join()
        store.sync(report("a"))
        servers.stop()
        started = time.monotonic()
        for call in (lambda: store.sync(report("a")), lambda: store.uncordon("a", "test")):
            with pytest.raises(CoordinationError) as failed:
                call()
            assert classify(failed.value) is RedisFailure.UNREACHABLE, failed.value
        assert time.monotonic() - started < 10  # a bound on a hang, not a performance target
        with pytest.raises(ClusterUnreachableError):
            store.client.ping()
        store.client.close()
    finally:
        servers.stop()


TIMING = {"heartbeat_interval": "250ms", "lease_ttl": "1500ms", "stop_grace_period": "10s"}


def test_agents_started_before_the_cluster_wait_for_it(tmp_path: Path, job_id: str) -> None:
    ports = [port_for_later() for _ in range(3)]  # known to the agents before the nodes start
    servers = RedisClusterServers(tmp_path / "redis", ports=ports)
    try:
        with local_cluster(servers.url, tmp_path, job=job_id, max_nodes=2, timing=TIMING) as job:
            job.start("a", "b")
            wait_for(lambda: "cannot reach Redis" in job.agents["a"].log(), 20, "a to say it waits")
            assert all(agent.alive() for agent in job.agents.values())
            servers.start()
            job.wait_running(2, timeout=60)
    finally:
        servers.stop()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_jobs_run_side_by_side_on_the_cluster(
    cluster: RedisClusterServers, job_id: str, tmp_path: Path
) -> None:
    """Job one trains (torch, gloo) and loses a worker; job two, on another node's slot, runs
    the test worker and never notices: same generation, same worker processes."""
    one, two = jobs_on_two_nodes(cluster, job_id)
    steps, every = 30, 5
    with (
        local_cluster(
            cluster.url,
            tmp_path / "one",
            job=one,
            max_nodes=2,
            max_restarts=3,
            timing=TIMING,
            entrypoint=training_entrypoint(tmp_path / "one", steps, every),
        ) as training,
        local_cluster(cluster.url, tmp_path / "two", job=two, max_nodes=2, timing=TIMING) as other,
    ):
        training.start("a", "b")
        other.start("c", "d")
        steady = other.wait_running(2, timeout=60)
        pids = {name: other.worker_pids(name) for name in ("c", "d")}
        wait_for(lambda: latest_step(training) >= 8, 90, "training to reach step 8")
        before = training.status()["generation"]
        os.kill(training.worker_pids("b")[0], signal.SIGKILL)
        training.wait_status(lambda d: d["state"] == "succeeded", 120, "job one to succeed")
        after = training.status()
        assert after["generation"] > before and after["restart_count"] == 1
        check_history(training, steps, every)
        doc = other.status()
        assert (doc["state"], doc["generation"]) == ("running", steady["generation"])
        assert doc["restart_count"] == 0
        assert {name: other.worker_pids(name) for name in ("c", "d")} == pids
        status = nodeagentctl("--redis", cluster.url, "--job", two, "status", "--json")
        assert status.returncode == 0, status.stderr
        shown = json.loads(status.stdout)
        assert (shown["job"], shown["generation"], shown["world_size"]) == (
            two,
            steady["generation"],
            2,
        )


def test_a_pool_spreads_its_jobs_over_the_cluster(
    cluster: RedisClusterServers, job_id: str, tmp_path: Path
) -> None:
    """Pool agents on the cluster URL: the pool's keys in one slot, two submitted jobs in
    slots of two other primaries; both are admitted and run, each on a node of its own."""
    one, two = jobs_on_two_nodes(cluster, job_id)
    with pool_cluster(cluster.url, tmp_path, pool=job_id) as pool:
        pool.start("p1", "p2")
        pool.wait_nodes(2, 60)
        pool.submit(one, "1")
        pool.submit(two, "1")
        pool.wait_job(one, "running", world=1, timeout=60)
        pool.wait_job(two, "running", world=1, timeout=60)
        assert set(pool.placements().values()) == {one, two}
