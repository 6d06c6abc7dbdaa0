"""Coordination at fleet scale: M simulated agents against one real redis-server.

The real coordination code (the SYNC and COMMIT Lua scripts, leader.plan) drives M simulated
nodes from this one process (their heartbeats pipelined, one heartbeat per node per interval;
no workers). After a warm-up, `--kill` nodes stop heartbeating; the simulated leader notices
them at its own heartbeats. Measured: detection (lease deadline -> node_lost, server time), the
leader's sync round trip, Redis CPU and commands per second.

    .venv/bin/python bench/fleet.py --nodes 100,1000,5000

Writes bench/results/fleet.json. Partial work for the benchmark issue (7): this is its part 3.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nodeagent.coord.client import connect  # noqa: E402
from nodeagent.coord.keys import JobKeys  # noqa: E402
from nodeagent.coord.store import JobStore  # noqa: E402
from nodeagent.leader import LeaderMemory, Policy, plan  # noqa: E402
from nodeagent.model import NodeReport  # noqa: E402
from nodeagent.state import NodeState  # noqa: E402
from tests.helpers.cluster import RedisServer  # noqa: E402

HEARTBEAT_S, LEASE_S = 1.0, 5.0


def report(name: str, acked: int) -> NodeReport:
    return NodeReport(
        name=name,
        address="10.0.0.1",
        state=NodeState.READY,
        acked_generation=acked,
        free_port=29500,
        lease_ttl_ms=int(LEASE_S * 1000),
    )


def redis_totals(client: Any) -> tuple[float, int]:
    cpu = client.info("cpu")
    stats = client.info("commandstats")
    return (
        float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]),
        sum(int(v["calls"]) for v in stats.values()),
    )


def run(server: RedisServer, nodes: int, kill: int, seconds: float) -> dict[str, Any]:
    keys = JobKeys("nodeagent", f"fleet-{nodes}")
    client = connect(server.url, 10.0)
    store = JobStore(client, keys)
    policy = Policy(
        min_nodes=1,
        max_nodes=nodes,
        target_nodes=nodes,
        nproc_per_node=8,
        max_restarts=3,
        join_settle_ms=0,
        rendezvous_timeout_ms=600_000,
    )
    names = [f"n{i:05d}" for i in range(nodes)]
    leader_name = names[0]
    reports = {name: report(name, 0) for name in names}
    memory = LeaderMemory()
    dead: set[str] = set()
    killed_at: float | None = None
    leader_rtts: list[float] = []
    lost: dict[str, int] = {}
    cpu0, calls0 = redis_totals(client)
    started = time.monotonic()
    tick = 0
    while time.monotonic() - started < seconds:
        begin = time.monotonic()
        if killed_at is None and begin - started > seconds / 3:
            dead = set(names[1 : 1 + kill])
            killed_at = time.time()
        t = time.monotonic()
        snapshot = store.sync(report(leader_name, 0))
        leader_rtts.append(time.monotonic() - t)
        if snapshot.leader_name == leader_name and snapshot.leader:
            decision = plan(snapshot.cluster_view(), policy, memory)
            memory = decision.memory
            if decision.record is not None or decision.reap or decision.events:
                try:
                    store.commit(snapshot.leader, snapshot.rev, decision)
                except Exception as exc:  # a refused write is retried next heartbeat
                    print("commit:", exc)
            for name in decision.reap:
                lease = next(x for x in snapshot.leases if x.name == name)
                lost[name] = snapshot.now_ms - lease.deadline_ms  # deadline -> noticed
        store.sync_many([reports[name] for name in names[1:] if name not in dead])
        tick += 1
        time.sleep(max(0.0, HEARTBEAT_S - (time.monotonic() - begin)))
    elapsed = time.monotonic() - started
    cpu1, calls1 = redis_totals(client)
    memory_bytes = int(client.info("memory")["used_memory"])
    detections = sorted(lost[n] / 1000 for n in dead if n in lost)
    return {
        "nodes": nodes,
        "killed": kill,
        "detected": f"{len(detections)}/{kill}",
        "detection_after_deadline_s": {
            "median": round(statistics.median(detections), 3) if detections else None,
            "max": round(max(detections), 3) if detections else None,
        },
        "leader_sync_ms": {
            "median": round(statistics.median(leader_rtts) * 1000, 2),
            "max": round(max(leader_rtts) * 1000, 2),
        },
        "heartbeats_per_s": round((nodes - kill / 2) / HEARTBEAT_S, 1),
        "redis_cpu_percent": round((cpu1 - cpu0) / elapsed * 100, 1),
        "redis_commands_per_s_incl_lua": round((calls1 - calls0) / elapsed),
        "redis_used_memory_mib": round(memory_bytes / 2**20, 1),
        "achieved_heartbeat_period_s": round(elapsed / tick, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="100,1000,5000")
    parser.add_argument("--kill", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=24.0)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "fleet.json"))
    args = parser.parse_args()
    runs: list[dict[str, Any]] = []
    results = {"heartbeat_s": HEARTBEAT_S, "lease_s": LEASE_S, "runs": runs}
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp))
        server.start()
        try:
            for nodes in (int(n) for n in args.nodes.split(",")):
                row = run(server, nodes, args.kill, args.seconds)
                print(json.dumps(row), flush=True)
                runs.append(row)
        finally:
            server.stop()
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
