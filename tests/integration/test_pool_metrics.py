"""The pool's gauges on real agents: the pool leader's /metrics counts the pool's nodes and
jobs and the queue's wait; the other agents say only that they do not lead."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from nodeagent.coord.keys import PoolKeys
from nodeagent.coord.pool import PoolStore
from tests.helpers.cluster import RedisServer, wait_for
from tests.helpers.pool import PoolCluster, pool_cluster
from tests.helpers.runas import AS_TESTER

pytestmark = pytest.mark.timeout(180)

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture
def pool(redis_server: RedisServer, tmp_path: Path, job_id: str) -> Iterator[PoolCluster]:
    with pool_cluster(redis_server.url, tmp_path, pool=job_id) as cluster:
        yield cluster


@pytest.fixture
def store(redis_server: RedisServer, job_id: str) -> Iterator[PoolStore]:
    client: redis.Redis = redis_server.client()
    try:
        yield PoolStore(client, PoolKeys("nodeagent", job_id))
    finally:
        client.close()


def scrape(address: str) -> Samples:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def metrics_addresses(store: PoolStore) -> tuple[str, dict[str, str]] | None:
    """The pool leader's name and every node's metrics address, from their pool reports."""
    snap = store.read()
    found = {n: r.metrics for n, r in snap.nodes.items() if r.metrics}
    if snap.leader is None or len(found) < len(snap.nodes):
        return None
    leader = snap.leader.split(" ", 1)[0]
    return (leader, found) if leader in found else None


def test_the_pool_leader_exports_nodes_jobs_and_the_queue_wait(
    pool: PoolCluster, store: PoolStore
) -> None:
    name = pool.pool
    pool.start("a", "b")
    pool.wait_nodes(2)
    pool.submit("big", "3")
    pool.wait_job("big", "pending")
    leader, addresses = wait_for(lambda: metrics_addresses(store), 30, "metrics addresses")

    def waiting() -> Samples | None:
        got = scrape(addresses[leader])
        wait = sample(got, "nodeagent_pool_queue_head_wait_seconds", pool=name)
        return got if wait is not None and wait > 0 else None

    got = wait_for(waiting, 30, f"{leader} to export the queue's wait")
    assert sample(got, "nodeagent_pool_leader", pool=name) == 1
    nodes = {s: sample(got, "nodeagent_pool_nodes", pool=name, state=s) for s in ("free", "busy")}
    assert nodes == {"free": 2, "busy": 0}
    assert sample(got, "nodeagent_pool_nodes", pool=name, state="unhealthy") == 0
    assert sample(got, "nodeagent_pool_jobs", pool=name, state="pending") == 1
    assert sample(got, "nodeagent_pool_jobs", pool=name, state="running") == 0
    pending = sample(
        got,
        "nodeagent_pool_job_pending_seconds",
        pool=name,
        job_id="big",
        user=str(AS_TESTER["user"]),
    )  # the user: whom an alert of it is routed to
    assert pending is not None and pending > 0
    (other,) = set(addresses) - {leader}
    theirs = scrape(addresses[other])
    assert sample(theirs, "nodeagent_pool_leader", pool=name) == 0
    assert not any(n.startswith("nodeagent_pool_nodes") for n, _ in theirs)  # counted once
    # Issue 62: a node that serves no job says its version, its pool heartbeat, its failed
    # pool calls and its GPUs (job_id "": none; no NVML on this machine: not available).
    assert [labels for n, labels in theirs if n == "nodeagent_build_info"] != []
    beaten = sample(theirs, "nodeagent_pool_last_heartbeat_timestamp_seconds", pool=name)
    assert beaten is not None and beaten > 0
    assert sample(theirs, "nodeagent_pool_redis_errors_total", pool=name) == 0
    assert sample(theirs, "nodeagent_gpu_monitoring_available", job_id="") is not None

    pool.start("c")  # big fits now: admitted, nothing pends
    pool.wait_job("big", "running", world=3)

    def admitted() -> Samples | None:
        got = scrape(addresses[leader])
        busy = sample(got, "nodeagent_pool_nodes", pool=name, state="busy")
        return got if busy == 3 else None

    got = wait_for(admitted, 30, f"{leader} to count big's three nodes busy")
    assert sample(got, "nodeagent_pool_jobs", pool=name, state="running") == 1
    assert sample(got, "nodeagent_pool_jobs", pool=name, state="pending") == 0
    assert sample(got, "nodeagent_pool_queue_head_wait_seconds", pool=name) == 0
    assert not any(n == "nodeagent_pool_job_pending_seconds" for n, _ in got)
