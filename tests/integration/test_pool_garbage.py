"""Garbage in a pool's keys (a clumsy operator, a hostile Redis writer): every agent stays up,
the garbage is ignored or taken over, and a job submitted afterwards still runs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from nodeagent.coord.keys import PoolKeys
from tests.helpers.cluster import RedisServer, wait_for
from tests.helpers.pool import PoolCluster, pool_cluster

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def pool(redis_server: RedisServer, tmp_path: Path, job_id: str) -> Iterator[PoolCluster]:
    with pool_cluster(redis_server.url, tmp_path, pool=job_id) as cluster:
        yield cluster


def spoil(db: redis.Redis, keys: PoolKeys) -> None:
    db.hset(keys.jobs, "evil", "not json")
    db.hset(keys.jobs, "ghost", '{"state": "running", "seq": 1e999, "submitted_ms": 0}')
    db.hset(keys.specs, "ghost", "{")
    db.hset(keys.placements, "a", "bad id!")
    db.hset(keys.placements, "phantom", "ghost")
    db.hset(keys.cancels, "nobody", "x" * 10_000)
    db.hset(keys.cordons, "b", '{"reason": 1}')
    db.zadd(keys.leases, {"ghost": float("inf"), "not a name": 1})
    db.set(keys.node("ghost"), '{"name": "ghost", "address": "x y"}')
    db.set(keys.leader, "garbage")  # no TTL, not "<node> <token>": taken over within a lease


def test_agents_survive_garbage_in_the_pool_and_jobs_still_run(
    pool: PoolCluster, redis_server: RedisServer
) -> None:
    db = redis_server.client()
    try:
        keys = PoolKeys("nodeagent", pool.pool)
        spoil(db, keys)
        pool.start("a", "b")
        wait_for(lambda: {"a", "b"} <= set(pool.placements()), 30, "both nodes in the pool")
        pool.submit("after", "2")
        pool.wait_job("after", "running", world=2, timeout=60)
        assert all(agent.alive() for agent in pool.agents.values())
        leader = str(db.get(keys.leader))
        assert leader.split(" ")[0] in ("a", "b"), leader  # the garbage lease was taken over
        jobs = pool.jobs()
        assert "evil" not in jobs and jobs["after"]["state"] == "running"
        nodes = pool.ctl("nodes")
        assert nodes.returncode == 0, nodes.stderr
        logs = "".join(agent.log() for agent in pool.agents.values())
        assert "Traceback" not in logs
        reported = logs.count("ignoring what nodeagent did not write")
        assert 1 <= reported <= 3, reported  # said when seen (and when it changes), not per beat
        assert "pool job 'evil'" in logs and "pool lease 'not a name'" in logs
    finally:
        db.close()
