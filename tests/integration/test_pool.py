"""A pool of real agents and a real redis-server: jobs submitted, admitted as gangs, run side
by side on disjoint nodes, queued until nodes free up; the pool leader fenced."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeagent.cli.ctl import caller
from nodeagent.coord.keys import PoolKeys
from nodeagent.coord.pool import PoolStore, PoolWrite
from nodeagent.errors import FencedError
from tests.helpers.cluster import WORKER, RedisServer, wait_for
from tests.helpers.pool import PoolCluster, pool_cluster
from tests.helpers.runas import AS_TESTER

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def pool(redis_server: RedisServer, tmp_path: Path, job_id: str) -> Iterator[PoolCluster]:
    with pool_cluster(redis_server.url, tmp_path, pool=job_id) as cluster:
        yield cluster


def on(placements: dict[str, str | None], job: str) -> set[str]:
    return {n for n, j in placements.items() if j == job}


def test_jobs_share_the_pool_queue_and_free_their_nodes(pool: PoolCluster) -> None:
    pool.start("a", "b", "c", "d")
    pool.wait_nodes(4)
    pool.submit("one", "2")
    pool.submit("two", "1:2")
    pool.wait_job("one", "running", world=2)
    two = pool.wait_job("two", "running", world=2)["generation"]
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
    assert pool.jobs()["two"]["generation"] == two  # never disturbed


def test_a_job_every_node_refuses_goes_back_to_pending_with_their_reasons(
    pool: PoolCluster,
) -> None:
    """The scheduler admits it (it cannot know a node's users); each node refuses it once
    placed; it does not stay running on 0 nodes but waits, saying why, and never starts."""
    pool.start("a", "b")
    pool.wait_nodes(2)
    pool.submit("theirs", "2", "--user", "nobody")  # not in the nodes' pool.users
    refused = "2 refuse it (a: user: 'nobody' may not run jobs on node a: not in its pool.users"
    try:
        wait_for(lambda: refused in pool.jobs()["theirs"]["reason"], 30, "the nodes' reasons")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{pool.diagnostics()}") from None
    logs = "".join(agent.log() for agent in pool.agents.values())
    assert "job theirs: refused by its nodes: a: user: 'nobody'" in logs  # the leader's round
    row = pool.jobs()["theirs"]
    assert row["state"] == "pending" and row["world_size"] == 0, row
    assert not any(pool.placements().values())
    assert not list(pool.job_records("theirs").glob("records.jsonl"))  # no worker ever started


def test_gang_admission_never_starts_below_min_nodes(pool: PoolCluster) -> None:
    pool.start("a", "b")
    pool.wait_nodes(2)
    pool.submit("big", "3")
    row = pool.wait_job("big", "pending")
    wait_for(lambda: "the pool has 2 healthy nodes" in pool.jobs()["big"]["reason"], 10, "why")
    assert row["world_size"] == 0 and not any(pool.placements().values())
    assert not list(pool.job_records("big").glob("records.jsonl"))  # no worker ever started
    pool.start("c")
    pool.wait_job("big", "running", world=3)


def test_losing_a_node_of_one_job_leaves_the_other_alone(pool: PoolCluster) -> None:
    pool.start("a", "b", "c", "d")
    pool.wait_nodes(4)
    pool.submit("left", "1:2")
    pool.submit("right", "2")
    pool.wait_job("left", "running", world=2)
    right = pool.wait_job("right", "running", world=2)["generation"]
    victim = sorted(on(pool.placements(), "left"))[0]
    pool.kill_tree(victim)
    pool.wait_job("left", "running", world=1)
    assert pool.jobs()["right"]["generation"] == right


def test_cancel_gives_the_workers_their_grace_and_frees_the_nodes(pool: PoolCluster) -> None:
    pool.start("a", "b")
    pool.wait_nodes(2)
    pool.submit("doomed", "2")
    pool.wait_job("doomed", "running", world=2)
    result = pool.ctl("cancel", "doomed")
    assert result.returncode == 0, result.stderr
    pool.wait_job("doomed", "cancelled")
    wait_for(lambda: not any(pool.placements().values()), 10, "nodes back in the pool")
    stops = (pool.job_records("doomed") / "records.jsonl").read_text().count('"stop"')
    assert stops == 2  # each worker saw SIGTERM (its chance to checkpoint)
    # Told to stop by the pool leader, once (pool/lifecycle.Stopping), not at every round.
    shown = pool.ctl("--job", "doomed", "events", "--json")
    assert shown.returncode == 0, shown.stderr
    told = [e for e in map(json.loads, shown.stdout.splitlines()) if e["type"] == "stop_requested"]
    assert [e["message"] for e in told] == [f"by {caller.by()}"], told  # who cancelled it
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


def pool_leader(pool: PoolCluster, redis_server: RedisServer) -> str | None:
    client = redis_server.client()
    try:
        value = client.get(PoolKeys("nodeagent", pool.pool).leader)
    finally:
        client.close()
    return str(value).split(" ")[0] if value else None


def test_killing_the_pool_leader_moves_no_job(pool: PoolCluster, redis_server: RedisServer) -> None:
    pool.start("z")  # first, so it leads; nodes are handed out in name order: not to z
    wait_for(lambda: pool_leader(pool, redis_server) == "z", 30, "z to lead the pool")
    pool.start("a", "b")
    pool.wait_nodes(3)
    pool.submit("steady", "2")
    steady = pool.wait_job("steady", "running", world=2)["generation"]
    assert on(pool.placements(), "steady") == {"a", "b"}
    pool.kill_tree("z")
    wait_for(lambda: pool_leader(pool, redis_server) in ("a", "b"), 15, "a new pool leader")
    pool.submit("after", "1")  # the new leader schedules
    wait_for(lambda: pool.jobs()["after"]["reason"] == "needs 1 nodes, 0 free", 15, "after")
    assert on(pool.placements(), "steady") == {"a", "b"}
    assert pool.jobs()["steady"]["generation"] == steady


def test_a_node_with_a_job_section_is_pinned_to_it(pool: PoolCluster, job_id: str) -> None:
    pinned_id = f"{job_id}-pinned"
    pinned = {
        "id": pinned_id,
        "entrypoint": [sys.executable, str(WORKER)],
        "env": {"RECORD_DIR": str(pool.job_records("pinned"))},
        **AS_TESTER,
    }
    pool.start("p", job=pinned)
    pool.start("free")
    row = pool.wait_job(pinned_id, "running", world=1)
    assert row["pinned"] and pool.placements() == {"p": pinned_id, "free": None}
    pool.submit("other", "1")
    pool.wait_job("other", "running", world=1)
    assert pool.placements() == {"p": pinned_id, "free": "other"}
    refused = pool.ctl("cancel", pinned_id)
    assert refused.returncode == 2 and "job: sections" in refused.stderr


def test_draining_a_pool_node_moves_its_job_to_a_free_one(pool: PoolCluster) -> None:
    pool.start("a", "b")
    pool.wait_nodes(2)
    pool.submit("mover", "1")
    pool.wait_job("mover", "running", world=1)
    (node,) = on(pool.placements(), "mover")
    result = pool.ctl("drain", node, "--wait", "--timeout", "30s")
    assert result.returncode == 0, result.stderr
    wait_for(lambda: on(pool.placements(), "mover") == {"a", "b"} - {node}, 30, "moved")
    pool.wait_job("mover", "running", world=1)
    assert pool.ctl("uncordon", node).returncode == 0
    unknown = pool.ctl("cordon", "ghost")
    assert unknown.returncode == 3 and "not in pool" in unknown.stderr  # no such node


def test_scale_a_pool_job_down_and_up_by_relative_counts(pool: PoolCluster) -> None:
    pool.start("a", "b", "c")
    pool.wait_nodes(3)
    pool.submit("elastic", "1:3")
    pool.wait_job("elastic", "running", world=3)
    down = pool.ctl("scale", "elastic", "-2", "--wait", "--timeout", "60s")
    assert down.returncode == 0, down.stderr + pool.diagnostics()
    wait_for(lambda: len(on(pool.placements(), "elastic")) == 1, 30, "two nodes given back")
    up = pool.ctl("scale", "elastic", "+1", "--wait", "--timeout", "60s")
    assert up.returncode == 0, up.stderr + pool.diagnostics()
    assert pool.wait_job("elastic", "running", world=2)["target_nodes"] == 2
    beyond = pool.ctl("scale", "elastic", "+5")
    assert beyond.returncode == 2 and "[min_nodes, max_nodes] = [1, 3]" in beyond.stderr


def test_a_selector_sends_a_job_to_the_nodes_with_its_labels(pool: PoolCluster) -> None:
    pool.start("a", labels={"gpu": "a100"})
    pool.start("b", labels={"gpu": "h100"})
    pool.wait_nodes(2)
    pool.submit("picky", "1", "--selector", "gpu=h100")
    pool.wait_job("picky", "running", world=1)
    assert pool.placements() == {"a": None, "b": "picky"}
    pool.submit("rare", "1", "--selector", "gpu=b200")
    wait_for(lambda: "2 lack gpu=b200" in pool.jobs()["rare"]["reason"], 10, "why it waits")
