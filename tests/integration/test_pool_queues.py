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
    pool.submit("q-first", "1", "--queue", "research")
    pool.wait_job("q-first", "running", world=1)
    pool.submit("q-second", "1", "--queue", "research")
    pool.submit("q-other", "2")
    pool.wait_job("q-other", "running", world=2)
    wait_for(
        lambda: (
            pool.jobs()["q-second"]["reason"]
            == "pending: queue research at its quota of 1 nodes (1 in use)"
        ),
        10,
        "why second waits",
    )
    listing = pool.ctl("queue", "list", "--json")
    rows = {r["queue"]: r for r in json.loads(listing.stdout)["queues"]}
    assert rows["research"] == {
        "queue": "research",
        "quota": 1,
        "gpu_quota": None,
        "gpus": 0,  # these nodes have no GPUs (no NVML here)
        "guaranteed": 1,
        "gpu_guaranteed": 0,
        "nodes": 1,
        "running": 1,
        "pending": 1,
    }
    assert rows["default"]["nodes"] == 2
    refused = pool.ctl("queue", "delete", "research")
    assert refused.returncode == 2 and "has 2 jobs that have not ended" in refused.stderr
    assert pool.ctl("queue", "set", "research", "--quota", "none").returncode == 0
    # The quota lifted, what holds it back now is the pool: other has the two other nodes.
    wait_for(lambda: pool.jobs()["q-second"]["reason"] == "needs 1 nodes, 0 free", 10, "why now")


def test_a_higher_priority_job_shrinks_a_lower_one_which_grows_back_after(
    pool: PoolCluster,
) -> None:
    pool.start("a", "b", "c")
    pool.wait_nodes(3)
    pool.submit("shrink-low", "1:3")
    low = pool.wait_job("shrink-low", "running", world=3)
    pool.submit("shrink-high", "2", "--priority", "10")
    pool.wait_job("shrink-high", "running", world=2)
    shrunk = pool.wait_job("shrink-low", "running", world=1)
    assert shrunk["reason"] == "shrunk 3 -> 1 nodes for job shrink-high: priority 10 > 0"
    assert shrunk["restarts"] == low["restarts"]  # a shrink is not a failure
    high = pool.jobs()["shrink-high"]
    (pool.job_records("shrink-high") / f"exit-{high['generation']}").write_text("0")
    pool.wait_job("shrink-high", "succeeded")
    pool.wait_job("shrink-low", "running", world=3, timeout=60)  # after its 2 s cooldown
    assert pool.jobs()["shrink-low"]["restarts"] == low["restarts"]


def test_a_preemptible_job_is_evicted_and_resumes_a_protected_one_never(
    pool: PoolCluster,
) -> None:
    pool.start("a", "b", "c")
    pool.wait_nodes(3)
    pool.submit("steady", "1")  # not preemptible
    pool.submit("spot", "2", "--preemptible")
    pool.wait_job("steady", "running", world=1)
    spot = pool.wait_job("spot", "running", world=2)
    pool.submit("giant", "3", "--priority", "10")  # it would need steady's node too: nothing moves
    wait_for(lambda: pool.jobs()["giant"]["reason"] == "needs 3 nodes, 0 free", 10, "giant waits")
    assert pool.jobs()["spot"]["state"] == "running"
    assert pool.ctl("cancel", "giant").returncode == 0
    pool.submit("vip", "2", "--priority", "10")
    pool.wait_job("vip", "running", world=2)
    evicted = pool.wait_job("spot", "pending")
    assert evicted["reason"].startswith("evicted by job vip (priority 10 > 0)")
    status = json.loads(pool.ctl("--job", "spot", "status", "--json").stdout)
    assert status["pool"]["state"] == "pending"
    assert status["pool"]["reason"].startswith("evicted by job vip")
    assert pool.jobs()["steady"]["state"] == "running"
    vip = pool.jobs()["vip"]
    (pool.job_records("vip") / f"exit-{vip['generation']}").write_text("0")
    pool.wait_job("vip", "succeeded")
    again = pool.wait_job("spot", "running", world=2, timeout=60)
    assert again["generation"] > spot["generation"] and again["restarts"] == spot["restarts"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["create", "q", "--quota", "0"], "quota 0: expected 1 to 1000000 nodes, or none"),
        (["create", "q", "--quota", "2", "--guaranteed", "3"], "guaranteed 3 above its quota of 2"),
        (["create", "q", "--guaranteed", "-1"], "guaranteed -1: expected 0 to 1000000 nodes"),
        (
            ["create", "q", "--gpu-quota", "4", "--gpu-guaranteed", "8"],
            "GPUs guaranteed 8 above its GPU quota of 4",
        ),
        (["create", "q", "--quota", "lots"], "expected a number of nodes or none, got 'lots'"),
        (["create", "default"], "queue default exists already"),
        (["set", "nosuch", "--quota", "3"], "no queue nosuch: `queue create nosuch` makes it"),
        (["delete", "nosuch"], "no queue nosuch"),
    ],
)
def test_impossible_queue_commands_are_refused_naming_what_is_wrong(
    pool: PoolCluster, args: list[str], message: str
) -> None:
    result = pool.ctl("queue", *args)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    listing = json.loads(pool.ctl("queue", "list", "--json").stdout)["queues"]
    assert [row["queue"] for row in listing] == ["default"]  # nothing was written
