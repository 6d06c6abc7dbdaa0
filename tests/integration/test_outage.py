"""Decision 5 against a real outage: Redis dies under a running job, then comes back empty."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.cluster import RedisServer, local_cluster, wait_for

# The agent stops its workers at half the lease and SIGKILLs what is left at 0.9 of it
# (job/lease.py): 4 s leaves a worker on a loaded machine 1.6 s to say it stopped.
LEASE_S = 4.0


def test_agents_fence_themselves_and_reform_after_redis_returns(tmp_path: Path) -> None:
    server = RedisServer(tmp_path)
    server.start()
    try:
        with local_cluster(
            server.url,
            tmp_path,
            job="outage",
            max_nodes=2,
            timing={"heartbeat_interval": "200ms", "lease_ttl": f"{LEASE_S}s"},
        ) as cluster:
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
