"""Queues and preemption by shrinking with real agents and a real redis-server: nodeagentctl
queue, a queue held at its quota, a higher-priority job that shrinks a lower one (no restart
charged) and the shrunk job growing back once it has ended."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.cluster import RedisServer, wait_for
from tests.helpers.pool import PoolCluster, pool_cluster

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def pool(redis_server: RedisServer, tmp_path: Path, job_id: str) -> Iterator[PoolCluster]:
    scheduling = {"resize_cooldown": "2s"}
    with pool_cluster(redis_server.url, tmp_path, pool=job_id, scheduling=scheduling) as cluster:
        yield cluster


def nodes_of(pool: PoolCluster, job: str) -> int:
    return sum(1 for j in pool.placements().values() if j == job)


def test_a_queue_at_its_quota_keeps_its_next_job_pending(pool: PoolCluster) -> None:
    made = pool.ctl("queue", "create", "research", "--quota", "1", "--guaranteed", "1")
    assert made.returncode == 0, made.stderr
    assert pool.ctl("queue", "create", "research").returncode == 2  # exists already
    unknown = pool.ctl("submit", "--name", "lost", "--queue", "nosuch", "--", "true")
    assert unknown.returncode == 2 and "queue nosuch does not exist" in unknown.stderr
    pool.start("a", "b", "c")
    pool.wait_nodes(3)
    pool.submit("first", "1", "--queue", "research")
    pool.wait_job("first", "running", world=1)
    pool.submit("second", "1", "--queue", "research")
    pool.submit("other", "2")
    pool.wait_job("other", "running", world=2)
    wait_for(
        lambda: (
            pool.jobs()["second"]["reason"]
            == "pending: queue research at its quota of 1 nodes (1 in use)"
        ),
        10,
        "why second waits",
    )
    listing = pool.ctl("queue", "list", "--json")
    rows = {r["queue"]: r for r in json.loads(listing.stdout)}
    assert rows["research"] == {
        "queue": "research",
        "quota": 1,
        "guaranteed": 1,
        "nodes": 1,
        "running": 1,
        "pending": 1,
    }
    assert rows["default"]["nodes"] == 2
    refused = pool.ctl("queue", "delete", "research")
    assert refused.returncode == 2 and "has 2 jobs that have not ended" in refused.stderr
    assert pool.ctl("queue", "set", "research", "--quota", "none").returncode == 0
    # The quota lifted, what holds it back now is the pool: other has the two other nodes.
    wait_for(lambda: pool.jobs()["second"]["reason"] == "needs 1 nodes, 0 free", 10, "why now")


def test_a_higher_priority_job_shrinks_a_lower_one_which_grows_back_after(
    pool: PoolCluster,
) -> None:
    pool.start("a", "b", "c")
    pool.wait_nodes(3)
    pool.submit("low", "1:3")
    low = pool.wait_job("low", "running", world=3)
    pool.submit("high", "2", "--priority", "10")
    pool.wait_job("high", "running", world=2)
    shrunk = pool.wait_job("low", "running", world=1)
    assert shrunk["reason"] == "shrunk 3 -> 1 nodes for job high: priority 10 > 0"
    assert shrunk["restarts"] == low["restarts"]  # a shrink is not a failure
    high = pool.jobs()["high"]
    (pool.job_records("high") / f"exit-{high['generation']}").write_text("0")
    pool.wait_job("high", "succeeded")
    pool.wait_job("low", "running", world=3, timeout=60)  # after its 2 s cooldown
    assert pool.jobs()["low"]["restarts"] == low["restarts"]
