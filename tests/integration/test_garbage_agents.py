"""Garbage in a running job's Redis keys, against real agents: the job goes on.

Each test runs one small cluster and writes several kinds of garbage in turn (the ones that do
not get in each other's way). After each, every agent must still run, the job must train or have
re-formed, and the garbage must have been reported (events, the garbage counter). The last test
forges a record and registers a phantom node: neither may choose where workers connect or how
many run.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from nodeagent.errors import CorruptStateError
from nodeagent.model.job import JobRecord, NodeReport
from nodeagent.state import JobState, NodeState
from tests.helpers.cluster import LocalCluster, RedisServer, check_records, local_cluster, wait_for
from tests.helpers.scrape import scrape

TIMING = {"heartbeat_interval": "200ms", "lease_ttl": "1s"}
EVIL = "10.66.66.66"


@pytest.fixture
def cluster(redis_server: RedisServer, job_id: str, tmp_path: Path) -> Iterator[LocalCluster]:
    with local_cluster(
        redis_server.url, tmp_path, job=job_id, max_nodes=3, target_nodes=2, timing=TIMING
    ) as c:
        yield c
        check_records(c)
        bad = [r for r in c.records() if r["event"] == "start" and EVIL in r["master"]]
        assert not bad, f"a worker was sent to the forged master: {bad}"
        assert all(r["world_size"] <= 3 for r in c.records() if r["event"] == "start")


def raw(cluster: LocalCluster) -> redis.Redis:
    return redis.Redis.from_url(cluster.redis_url)


def all_alive(cluster: LocalCluster) -> None:
    dead = {n: a.proc.returncode for n, a in cluster.agents.items() if not a.alive()}
    assert not dead, f"agents exited: {dead}\n{cluster.diagnostics()}"


def garbage_events(cluster: LocalCluster) -> list[dict[str, Any]]:
    try:
        events = cluster.events()
    except CorruptStateError:  # the events stream itself is garbage until the leader deletes it
        return []
    return [e for e in events if e["type"] == "redis_garbage"]


def reported(cluster: LocalCluster, kind: str, words: str) -> dict[str, Any]:
    def find() -> dict[str, Any] | None:
        return next(
            (
                e
                for e in garbage_events(cluster)
                if e["data"]["kind"] == kind and words in e["message"]
            ),
            None,
        )

    return wait_for(find, 10, f"a redis_garbage event about {kind}: {words}")


def still_running(cluster: LocalCluster, world: int = 2) -> dict[str, Any]:
    """Every agent up, the job running at `world` with its workers started."""
    all_alive(cluster)
    doc = cluster.wait_status(
        lambda d: (
            d["state"] == "running"
            and d["world_size"] == world
            and len(cluster.starts(d["generation"])) == world
        ),
        20,
        f"the job running at world {world}",
    )
    all_alive(cluster)
    return doc


def counted(cluster: LocalCluster) -> float:
    """nodeagent_redis_garbage_total over every agent and kind of key."""
    total = 0.0
    for node in cluster.status()["nodes"]:
        if node["metrics"]:
            for (name, _), value in scrape(node["metrics"]).items():
                if name == "nodeagent_redis_garbage_total":
                    total += value
    return total


def server_ms(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return int(seconds) * 1000 + int(micros) // 1000


Step = tuple[str, Callable[[LocalCluster, redis.Redis], object], str, str]


def wrong_type(key: str) -> Callable[[LocalCluster, redis.Redis], object]:
    """Replace `key` by a set, atomically (agents write some of these keys all the time)."""

    def write(c: LocalCluster, r: redis.Redis) -> object:
        pipe = r.pipeline(transaction=True)
        pipe.delete(key)
        pipe.sadd(key, "garbage")
        return pipe.execute()

    return write


def test_agents_survive_garbage_and_the_job_goes_on(cluster: LocalCluster) -> None:
    cluster.start("a", "b", "c")  # target 2: one is a standby
    first = still_running(cluster)
    standby = next(n for n in "abc" if n not in first["members"])
    r, keys = raw(cluster), cluster.store.keys
    steps: list[Step] = [
        ("rev", lambda c, r: r.hset(keys.record, "rev", "abc"), "job", "field rev"),
        ("inf lease", lambda c, r: r.zadd(keys.leases, {"evil": "+inf"}), "leases", "evil"),
        (
            "scale 1e999",
            lambda c, r: r.xadd(keys.commands, {"command": '{"type":"scale","target":1e999}'}),
            "commands",
            "not JSON",
        ),
        (
            "scale 2.9",
            lambda c, r: r.xadd(keys.commands, {"command": '{"type":"scale","target":2.9}'}),
            "commands",
            "2.9",
        ),
        (
            "drain false",
            lambda c, r: r.hset(
                keys.cordons, standby, json.dumps({"reason": "x", "by": "y", "drain": "false"})
            ),
            "cordons",
            "drain",
        ),
        ("cursor", lambda c, r: r.hset(keys.record, "cursor", "not-an-id"), "job", "cursor"),
        ("epoch", lambda c, r: r.set(keys.leader_epoch, "abc"), "", ""),  # used at a take-over
        ("leader", lambda c, r: r.set(keys.leader, "garbage"), "leader", "not"),
        ("epoch at the take-over", lambda c, r: None, "leader-epoch", "not an integer"),
        ("leases type", wrong_type(keys.leases), "leases", "not a zset"),
        ("cordons type", wrong_type(keys.cordons), "cordons", "not a hash"),
        ("commands type", wrong_type(keys.commands), "commands", "not a stream"),
        ("events type", wrong_type(keys.events), "events", "not a stream"),
    ]
    for name, write, kind, words in steps:
        write(cluster, r)
        if kind:
            reported(cluster, kind, words)
        after = still_running(cluster)
        assert after["target_nodes"] == 2, name  # neither 1e999 nor 2.9 was applied
    assert counted(cluster) >= len([s for s in steps if s[2]])
    nodes = {n["name"]: n for n in cluster.status()["nodes"]}
    assert nodes[standby]["cordon"] is None  # "drain": "false" neither drained nor cordoned it
    assert nodes[standby]["state"] in ("standby", "running"), nodes[standby]
    # A garbage gen, then a worker failure: the job re-forms and the failure is charged.
    running = still_running(cluster)
    r.hset(keys.record, "gen", "abc")
    os.kill(cluster.worker_pids(running["members"][0])[0], signal.SIGKILL)
    after = cluster.wait_running(2, after_generation=running["generation"])
    assert after["restart_count"] == running["restart_count"] + 1
    # The job hash of the wrong type: deleted by the leader, which writes back the generation
    # its members still run (job/resume.py): the job goes on, nothing restarts.
    before = cluster.status()["generation"]
    wrong_type(keys.record)(cluster, r)
    reported(cluster, "job", "not a hash")
    wait_for(lambda: cluster.status()["reason"] == "resumed", 30, "the record written back")
    assert cluster.wait_running(2)["generation"] == before
    status = cluster.ctl("status")
    assert status.returncode == 0, status.stderr
    all_alive(cluster)


def forged(record: JobRecord, **changes: Any) -> str:
    doc = json.loads(record.to_json())
    doc.update(changes)
    return json.dumps(doc)


def current_record(cluster: LocalCluster) -> JobRecord:
    snapshot = cluster.store.snapshot()
    assert snapshot.record is not None
    return snapshot.record


class Phantom:
    """A node that exists only in Redis: a lease and a report renewed by a writer."""

    def __init__(self, r: redis.Redis, cluster: LocalCluster, name: str, acked: int) -> None:
        self.r, self.keys, self.name = r, cluster.store.keys, name
        self.report = NodeReport(
            name=name,
            address=EVIL,
            state=NodeState.READY,
            acked_generation=acked,
            free_port=4444,
            lease_ttl_ms=1000,
        )
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            self.r.set(self.keys.node(self.name), self.report.to_json(), px=1000)
            self.r.zadd(self.keys.leases, {self.name: server_ms(self.r) + 1000})
            self.stop.wait(0.2)

    def __enter__(self) -> Phantom:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(5)


def test_a_forged_record_or_a_phantom_cannot_redirect_workers(cluster: LocalCluster) -> None:
    cluster.start("a", "b")
    doc = still_running(cluster)
    r, keys = raw(cluster), cluster.store.keys
    record = current_record(cluster)
    # A forged RUNNING record: the next generation, 4 workers a node, a master of the writer's.
    text = forged(
        record,
        generation=record.generation + 1,
        nproc_per_node=4,
        master_addr=EVIL,
        master_port=4444,
    )
    pids = {name: cluster.worker_pids(name) for name in ("a", "b")}
    r.hset(keys.record, mapping={"record": text, "gen": record.generation + 1})
    reported(cluster, "job", "rank-0 member")
    # The leader writes back what its members run (job/resume.py), not the writer's record:
    # the same generation, the same workers, never a worker started for the writer's master.
    wait_for(lambda: cluster.status()["reason"] == "resumed", 30, "the record written back")
    after = still_running(cluster)
    assert after["generation"] == record.generation
    assert {name: cluster.worker_pids(name) for name in ("a", "b")} == pids
    starts = cluster.starts(after["generation"])
    assert {s["master"].split(":")[0] for s in starts} == {"127.0.0.1"}
    assert {s["world_size"] for s in starts} == {2}
    # A phantom that sorts first and claims to have acknowledged the next generation, then a
    # worker failure: the phantom never acknowledges the generation that follows, so it is
    # waited for until it stops, and never becomes a member, let alone rank 0.
    with Phantom(r, cluster, "aaa", acked=after["generation"] + 1):
        os.kill(cluster.worker_pids("b")[0], signal.SIGKILL)
        time.sleep(2)
        all_alive(cluster)
    final = still_running(cluster)
    assert "aaa" not in final["members"] and final["master"].startswith("127.0.0.1:")
    assert final["generation"] > doc["generation"] and JobState(final["state"]) is JobState.RUNNING
