"""What planning the memory tier's copies costs Redis, each node planning or the leader.

    .venv/bin/python bench/copy_plan_read.py [--nodes 100,1000,4000]

Each node planning (before job/checkpoints/handouts.py): every node read the reports of all the
job's members (one MGET of M keys through JobStore.peer_reports) once per new save: M reads of M
reports per save interval, M² in all. Here, on a real redis-server, M node reports as an agent with
the memory tier publishes them (its own rank's save and a copy of a peer's, with digests, its
replica listener's address and its rack) are written with JobStore.sync_many, then a sample of
peer_reports calls for all M names is made from this one process, as M nodes would each make one.
Per M: the report's size; per call, the median wall time (client side, with decoding), Redis CPU
(INFO used_cpu_sys+user) and bytes sent (INFO total_net_output_bytes); and projected to a whole
round (M calls, one save interval): Redis CPU seconds and bytes sent.

The leader planning (job/checkpoints/handouts.py): the leader already holds every report; it plans
every node's copies of a new save (each node holds only its own: every node sends one), and writes
every share (JobStore.hand_out, the round where every share changed); each node reads its own
(JobStore.handout). Per M: the leader's planning time (median of 5, this process), the write's wall
time and Redis CPU, a node's read (`calls` x 500 reads), projected to a round. Writes
bench/results/copy-plan-read.json.
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
from nodeagent.job.checkpoints import replication  # noqa: E402
from nodeagent.model.job import NodeReport  # noqa: E402
from nodeagent.model.tiers import Held, TierReport  # noqa: E402
from nodeagent.state import NodeState  # noqa: E402
from tests.helpers.cluster import RedisServer  # noqa: E402

BATCH = 1000
SHARE_READS = 500  # share reads per peer_reports call sampled
STEP, GENERATION = 120, 7


def report(index: int, count: int, copied: bool = True) -> NodeReport:
    """Node `index` of `count`, one rank a node: its own save of STEP and, `copied`, its
    predecessor's."""
    peer = (index - 1) % count
    own = Held(STEP, count, (index,), GENERATION, (f"{index:016x}",))
    copy = (Held(STEP, count, (peer,), GENERATION, (f"{peer:016x}",)),) if copied else ()
    address = f"10.{index // 65536}.{index // 256 % 256}.{index % 256}"
    tier = TierReport((own,), (), (), copy, f"{address}:7400", f"rack-{index % 16}")
    return NodeReport(
        name=f"node-{index:05d}",
        address=address,
        state=NodeState.RUNNING,
        free_port=1,
        lease_ttl_ms=60_000,
        tier=tier,
    )


def totals(client: Any) -> tuple[float, int]:
    cpu = client.info("cpu")
    stats = client.info("stats")
    return float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]), int(
        stats["total_net_output_bytes"]
    )


def measure(url: str, count: int, calls: int) -> dict[str, Any]:
    client = connect(url, 60.0)
    client.flushall()
    store = JobStore(client, JobKeys("nodeagent", f"copies-{count}"))
    reports = [report(i, count) for i in range(count)]
    for start in range(0, count, BATCH):
        store.sync_many(reports[start : start + BATCH])
    names = [r.name for r in reports]
    assert len(store.peer_reports(names)) == count  # every report reads back
    walls = []
    cpu_before, sent_before = totals(client)
    for _ in range(calls):
        began = time.perf_counter()
        store.peer_reports(names)
        walls.append(time.perf_counter() - began)
    cpu_after, sent_after = totals(client)
    cpu_per_call = (cpu_after - cpu_before) / calls
    sent_per_call = (sent_after - sent_before) / calls
    return {
        **leader_plans(client, store, count, calls),
        **{
            "nodes": count,
            "report_bytes": len(reports[0].to_json()),
            "calls": calls,
            "call_wall_ms_median": round(statistics.median(walls) * 1000, 3),
            "call_redis_cpu_ms": round(cpu_per_call * 1000, 3),
            "call_sent_bytes": round(sent_per_call),
            "round_redis_cpu_s": round(cpu_per_call * count, 2),
            "round_sent_mb": round(sent_per_call * count / 1e6, 1),
        },
    }


def leader_plans(client: Any, store: JobStore, count: int, calls: int) -> dict[str, Any]:
    """The leader's way: plan every share, write them all, each node reads its own."""
    nodes = {r.name: r for r in (report(i, count, copied=False) for i in range(count))}
    members = list(nodes)
    plans = []
    for _ in range(5):
        began = time.perf_counter()
        order = replication.ring(members, {n: "" for n in members})
        sends = replication.copies(order, nodes, 1)
        shares = {n: s.to_json() for n, s in replication.handouts(GENERATION, nodes, sends).items()}
        plans.append(time.perf_counter() - began)
    client.set(store.keys.leader, "bench 1")
    cpu_before, _ = totals(client)
    began = time.perf_counter()
    store.hand_out("bench 1", shares, [], reset=True)
    write_wall = time.perf_counter() - began
    cpu_written, sent_before = totals(client)
    reads = calls * SHARE_READS  # small reads: many, or INFO's own cost shows in each
    for i in range(reads):
        assert store.handout(members[(i * 7919) % count]) is not None
    cpu_after, sent_after = totals(client)
    read_cpu = (cpu_after - cpu_written) / reads
    read_sent = (sent_after - sent_before) / reads
    return {
        "share_bytes": len(shares[members[0]]),
        "leader_plan_ms_median": round(statistics.median(plans) * 1000, 1),
        "leader_write_ms": round(write_wall * 1000, 1),
        "leader_write_redis_cpu_ms": round((cpu_written - cpu_before) * 1000, 1),
        "share_read_redis_cpu_us": round(read_cpu * 1e6, 1),
        "handout_round_redis_cpu_s": round(cpu_written - cpu_before + read_cpu * count, 3),
        "handout_round_sent_mb": round(read_sent * count / 1e6, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="100,1000,4000")
    parser.add_argument("--calls", type=int, default=30, help="peer_reports calls sampled per M")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "copy-plan-read.json"))
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp))
        server.start()
        try:
            rows = [measure(server.url, int(n), args.calls) for n in args.nodes.split(",")]
        finally:
            server.stop()
    for row in rows:
        print(
            f"M={row['nodes']:>6}: report {row['report_bytes']} B; one node's read "
            f"{row['call_wall_ms_median']} ms (Redis CPU {row['call_redis_cpu_ms']} ms, "
            f"{row['call_sent_bytes'] / 1e6:.2f} MB); a round of M reads: Redis CPU "
            f"{row['round_redis_cpu_s']} s, {row['round_sent_mb']} MB sent"
        )
        print(
            f"        leader: plans every share in {row['leader_plan_ms_median']} ms, writes "
            f"them in {row['leader_write_ms']} ms (Redis CPU {row['leader_write_redis_cpu_ms']}"
            f" ms); a share {row['share_bytes']} B, read in {row['share_read_redis_cpu_us']} us"
            f" of Redis CPU; a round: Redis CPU {row['handout_round_redis_cpu_s']} s, "
            f"{row['handout_round_sent_mb']} MB sent"
        )
    Path(args.out).write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
