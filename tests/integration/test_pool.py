"""A pool of real agents and a real redis-server: jobs submitted, admitted as gangs, run side
by side on disjoint nodes, queued until nodes free up; the pool leader fenced."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeagent.coord.keys import PoolKeys
from nodeagent.coord.pool import PoolStore, PoolWrite
from nodeagent.errors import FencedError
from tests.helpers.cluster import RedisServer, wait_for
from tests.helpers.pool import PoolCluster, pool_cluster

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def pool(redis_server: RedisServer, tmp_path: Path, job_id: str) -> Iterator[PoolCluster]:
    with pool_cluster(redis_server.url, tmp_path, pool=job_id) as cluster:
        yield cluster


def on(placements: dict[str, str | None], job: str) -> set[str]:
    return {n for n, j in placements.items() if j == job}


def test_jobs_share_the_pool_queue_and_free_their_nodes(pool: PoolCluster) -> None:
    pool.start("a", "b", "c", "d")
    wait_for(lambda: len(pool.placements()) == 4, 30, "four nodes in the pool")
    pool.submit("one", "2")
    pool.submit("two", "1:2")
    pool.wait_job("one", "running", world=2)
    pool.wait_job("two", "running", world=2)
    placements = pool.placements()
    assert len(on(placements, "one")) == 2 and len(on(placements, "two")) == 2
    pool.submit("three", "2")
    waiting = pool.wait_job("three", "pending")
    assert waiting["position"] == 1
    wait_for(lambda: pool.jobs()["three"]["reason"] == "needs 2 nodes, 0 free", 10, "its reason")
    before = {n: j for n, j in pool.placements().items()}
    # One's workers all exit 0: the job succeeds and its nodes go to the job that waited.
    one = pool.jobs()["one"]
    (pool.job_records("one") / f"exit-{one['generation']}").write_text("0")
    pool.wait_job("one", "succeeded")
    pool.wait_job("three", "running", world=2)
    after = pool.placements()
    assert on(after, "three") == on(before, "one")
    assert on(after, "two") == on(before, "two")
    assert pool.jobs()["two"]["generation"] == 1  # never disturbed


def test_gang_admission_never_starts_below_min_nodes(pool: PoolCluster) -> None:
    pool.start("a", "b")
    wait_for(lambda: len(pool.placements()) == 2, 30, "two nodes in the pool")
    pool.submit("big", "3")
    row = pool.wait_job("big", "pending")
    wait_for(lambda: "the pool has 2 healthy nodes" in pool.jobs()["big"]["reason"], 10, "why")
    assert row["world_size"] == 0 and not any(pool.placements().values())
    assert not list(pool.job_records("big").glob("records.jsonl"))  # no worker ever started
    pool.start("c")
    pool.wait_job("big", "running", world=3)


def test_losing_a_node_of_one_job_leaves_the_other_alone(pool: PoolCluster) -> None:
    pool.start("a", "b", "c", "d")
    wait_for(lambda: len(pool.placements()) == 4, 30, "four nodes in the pool")
    pool.submit("left", "1:2")
    pool.submit("right", "2")
    pool.wait_job("left", "running", world=2)
    pool.wait_job("right", "running", world=2)
    victim = sorted(on(pool.placements(), "left"))[0]
    pool.kill_tree(victim)
    pool.wait_job("left", "running", world=1)
    assert pool.jobs()["right"]["generation"] == 1


def test_cancel_gives_the_workers_their_grace_and_frees_the_nodes(pool: PoolCluster) -> None:
    pool.start("a", "b")
    wait_for(lambda: len(pool.placements()) == 2, 30, "two nodes in the pool")
    pool.submit("doomed", "2")
    pool.wait_job("doomed", "running", world=2)
    result = pool.ctl("cancel", "doomed")
    assert result.returncode == 0, result.stderr
    pool.wait_job("doomed", "cancelled")
    wait_for(lambda: not any(pool.placements().values()), 10, "nodes back in the pool")
    stops = (pool.job_records("doomed") / "records.jsonl").read_text().count('"stop"')
    assert stops == 2  # each worker saw SIGTERM (its chance to checkpoint)
    again = pool.ctl("cancel", "doomed")
    assert again.returncode == 2 and "has ended already (cancelled)" in again.stderr
    scale = pool.ctl("scale", "doomed", "1")
    assert scale.returncode == 2 and "it has ended (cancelled)" in scale.stderr


def test_a_deposed_pool_leader_cannot_write(redis_server: RedisServer, job_id: str) -> None:
    client = redis_server.client()
    try:
        store = PoolStore(client, PoolKeys("nodeagent", job_id))
        client.set(store.keys.leader, "a 7", px=5000)
        store.commit("a 7", PoolWrite(place={"n1": "job"}))
        assert client.hget(store.keys.placements, "n1") == "job"
        client.set(store.keys.leader, "b 8", px=5000)  # b took over
        with pytest.raises(FencedError):
            store.commit("a 7", PoolWrite(place={"n1": "other"}))
        assert client.hget(store.keys.placements, "n1") == "job"
    finally:
        client.close()
