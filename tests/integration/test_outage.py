"""Decision 5 against a real outage: Redis dies under a running job, then comes back empty.

With ride-through off every agent fences itself before its lease can lapse, and the job
re-forms; with it on (the default) the members, hearing each other, train on through it, and
the leader writes the lost record back from what they run: no worker stops."""

from __future__ import annotations

import signal
import time
from contextlib import AbstractContextManager as ContextManager
from pathlib import Path

from tests.helpers.cluster import LocalCluster, RedisServer, local_cluster, wait_for
from tests.helpers.pool import pool_cluster

# The agent stops its workers at half the lease and SIGKILLs what is left at 0.9 of it
# (job/lease.py): 4 s leaves a worker on a loaded machine 1.6 s to say it stopped.
LEASE_S = 4.0


def _job(server: RedisServer, directory: Path, **timing: str) -> ContextManager[LocalCluster]:
    """A job of two agents on `server`, heartbeat 200 ms, lease LEASE_S, `timing` more."""
    every = {"heartbeat_interval": "200ms", "lease_ttl": f"{LEASE_S}s", **timing}
    return local_cluster(server.url, directory, job="outage", max_nodes=2, timing=every)


def test_agents_fence_themselves_and_reform_after_redis_returns(tmp_path: Path) -> None:
    server = RedisServer(tmp_path)
    server.start()
    try:
        with _job(server, tmp_path, ride_through="off") as cluster:
            cluster.start("a", "b")
            before = cluster.wait_running(2)
            last_heartbeats = [
                lease.deadline_ms / 1000 - LEASE_S for lease in cluster.store.snapshot().leases
            ]
            server.stop()  # no persistence: everything in Redis is gone
            wait_for(
                lambda: len([r for r in cluster.records() if r["event"] == "stop"]) == 2,
                15,
                "both nodes to stop their workers",
            )
            stops = [r["time"] for r in cluster.records() if r["event"] == "stop"]
            # Every worker was stopped before the server could have expired its node's lease.
            assert max(stops) < min(last_heartbeats) + LEASE_S + 0.2  # 0.2: newest heartbeat unseen
            server.start()  # same port, empty
            after = cluster.wait_running(2, timeout=30, after_generation=before["generation"])
            assert after["generation"] > before["generation"]  # never reused after the data loss
            assert all(agent.alive() for agent in cluster.agents.values())
            logs = cluster.agents["a"].log()
            assert "cannot reach Redis" in logs and "Redis reachable again" in logs
            assert "fenced" in logs
    finally:
        server.stop()


def test_agents_ride_through_and_the_job_goes_on_in_its_generation(tmp_path: Path) -> None:
    """Redis down for three leases and back empty: the workers were never stopped, the
    generation is the same, and the record says it was resumed."""
    server = RedisServer(tmp_path)
    server.start()
    try:
        with _job(server, tmp_path) as cluster:
            cluster.start("a", "b")
            before = cluster.wait_running(2)
            pids = {name: cluster.worker_pids(name) for name in ("a", "b")}
            server.stop()  # no persistence: everything in Redis is gone
            wait_for(
                lambda: all("riding through" in cluster.agents[n].log() for n in ("a", "b")),
                3 * LEASE_S,
                "both agents to ride through",
            )
            time.sleep(3 * LEASE_S)
            server.start()  # same port, empty

            def resumed() -> bool:
                doc = cluster.status()
                return bool(doc["state"] == "running" and doc["reason"] == "resumed")

            wait_for(resumed, 30, "the record written back")
            doc = cluster.status()
            assert doc["generation"] == before["generation"] and doc["world_size"] == 2
            assert [r for r in cluster.records() if r["event"] == "stop"] == []
            assert {name: cluster.worker_pids(name) for name in ("a", "b")} == pids
            back = "Redis reachable again after riding through"  # each at its next heartbeat
            wait_for(
                lambda: all(back in cluster.agents[n].log() for n in ("a", "b")),
                30,
                "both agents to say they rode through",
            )
            assert all("fenced" not in cluster.agents[n].log() for n in ("a", "b"))
    finally:
        server.stop()


def test_a_pool_rides_through_redis_frozen_and_no_job_moves(tmp_path: Path) -> None:
    """A pool of three agents running two submitted jobs; redis-server stopped (SIGSTOP) for
    three leases, every pool lease and job lease lapsing meanwhile. The first agent back leads
    the pool: it keeps the lapsed nodes' placements, which their jobs still count, and each
    job's leader awaits its riding members. No job moves, no worker restarts."""
    server = RedisServer(tmp_path)
    server.start()
    try:
        with pool_cluster(server.url, tmp_path) as pool:
            pool.start("a", "b", "c")
            pool.wait_nodes(3)
            pool.submit("one", "2")
            pool.submit("two", "1")
            worlds = {"one": 2, "two": 1}
            # At its world, its workers up: a row says running before its generation is in it.
            before = {
                job: pool.wait_job(job, "running", world=world)["generation"]
                for job, world in worlds.items()
            }
            starts = {job: pool.wait_started(job, world) for job, world in worlds.items()}
            placements = pool.placements()
            assert server.proc is not None
            server.proc.send_signal(signal.SIGSTOP)
            try:
                time.sleep(3 * 3.0)  # the pool's lease is 3 s (tests/helpers/pool.py)
            finally:
                server.proc.send_signal(signal.SIGCONT)
            wait_for(lambda: len(pool.placements()) == 3, 30, "every node back in the pool")
            time.sleep(3.0)  # a lease more: nothing moves late
            assert pool.placements() == placements
            rows = pool.jobs()
            assert {job: rows[job]["generation"] for job in ("one", "two")} == before
            assert {job: pool.starts(job) for job in ("one", "two")} == starts
            assert all("riding through" in agent.log() for agent in pool.agents.values())
    finally:
        server.stop()
