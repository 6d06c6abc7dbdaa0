"""Coordination at fleet scale: M simulated agents against one real redis-server.

The real coordination code, no workers. The leader runs in this process as an agent does: the
SYNC script every heartbeat, `Leadership` (leader.plan and the fenced COMMIT script), and a
wake-up at the earliest lease deadline. The M-1 followers run in a second process: one SYNC per
node per heartbeat, pipelined; they watch the record every 50 ms and acknowledge a new generation
at once, in one more round (they have no workers to stop); while a generation waits for them, the
leader re-reads every 50 ms (a real one is woken by the node_ready events). After a warm-up,
`--kill` followers stop heartbeating.

Measured per M, in Redis server time:
- detection: a dead node's lease deadline -> node_lost (a fault is noticed within the lease
  plus this);
- announced: deadline -> the next generation announced;
- started:   deadline -> the next generation started (every survivor acknowledged, members and
  ranks written);
- the leader's sync round trip (it reads every report); Redis CPU and commands per second
  (counting those inside the Lua scripts) over the steady window between formation and the
  kill; memory and bytes per node.
If the follower process cannot heartbeat every node once a second (this machine's limit, not
Redis's), the run says so (simulator_kept_up: false) and reports no detection figures.

    .venv/bin/python bench/fleet.py --nodes 100,1000,5000,10000

Writes bench/results/fleet.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nodeagent.bounded import unbounded  # noqa: E402
from nodeagent.coord.client import connect  # noqa: E402
from nodeagent.coord.keys import JobKeys  # noqa: E402
from nodeagent.coord.store import JobStore  # noqa: E402
from nodeagent.leader import Policy  # noqa: E402
from nodeagent.leading import Leadership  # noqa: E402
from nodeagent.metrics import AgentMetrics  # noqa: E402
from nodeagent.model import JobRecord, NodeReport  # noqa: E402
from nodeagent.state import JobState, NodeState  # noqa: E402
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


def followers(
    url: str, job: str, names: list[str], dead: list[str], kill_at: float, end: float, rounds: Any
) -> None:
    """The M-1 followers: heartbeat every node each interval. A new generation is acknowledged
    at once, in one more round (a real agent is woken by the stream and has workers to stop)."""
    client = connect(url, 30.0)
    keys = JobKeys("nodeagent", job)
    store = JobStore(client, keys)
    acked, next_beat = 0, 0.0
    gone = set(dead)
    while time.time() < end:
        raw = client.hget(keys.record, "record")
        generation = JobRecord.from_json(raw).generation if raw else 0
        if generation != acked or time.monotonic() >= next_beat:
            acked, next_beat = generation, time.monotonic() + HEARTBEAT_S
            alive = names if time.time() < kill_at else [n for n in names if n not in gone]
            store.sync_many([report(name, acked) for name in alive])
            rounds.value += 1
        time.sleep(0.05)


def redis_totals(client: Any) -> tuple[float, int]:
    cpu = client.info("cpu")
    stats = client.info("commandstats")
    return (
        float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]),
        sum(int(v["calls"]) for v in stats.values()),
    )


def run(server: RedisServer, nodes: int, kill: int, seconds: float) -> dict[str, Any]:
    job = f"fleet-{nodes}"
    keys = JobKeys("nodeagent", job)
    client = connect(server.url, 30.0)
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
    leadership = Leadership(
        store, policy, AgentMetrics(job, "bench"), LEASE_S, time.monotonic, unbounded
    )
    names = [f"n{i:05d}" for i in range(nodes)]
    leader_name, dead = names[0], names[1 : 1 + kill]
    memory0 = int(client.info("memory")["used_memory"])
    start = time.time()
    kill_at, end = start + seconds / 2, start + seconds
    context = multiprocessing.get_context("fork")
    rounds = context.Value("i", 0)
    others = context.Process(
        target=followers, args=(server.url, job, names[1:], dead, kill_at, end, rounds)
    )
    others.start()
    acked, rtts, next_beat = 0, [], time.monotonic()
    deadlines: dict[str, float] = {}
    steady_from = start + seconds / 4  # formed by then; the steady window ends at the kill
    window: list[tuple[float, float, int, int]] = []  # (time, redis cpu, redis calls, rounds)
    while time.time() < end:
        now = time.time()
        if len(window) < 2 and now >= (steady_from if not window else kill_at):
            window.append((time.monotonic(), *redis_totals(client), rounds.value))
        if not deadlines and now > kill_at + HEARTBEAT_S + 0.5:  # final, not reaped yet
            scores = {n: client.zscore(keys.leases, n) for n in dead}
            deadlines = {n: float(v) / 1000 for n, v in scores.items() if v is not None}
        began = time.monotonic()
        snapshot = store.sync(report(leader_name, acked))
        rtts.append(time.monotonic() - began)
        if snapshot.record is not None:
            acked = snapshot.record.generation
        if began >= next_beat:
            next_beat = began + HEARTBEAT_S
        leading = snapshot.leader and snapshot.leader_name == leader_name
        if leading and leadership.lead(snapshot.leader or "", snapshot).again:
            continue
        wake = min(next_beat, leadership.next_expiry or next_beat)
        if snapshot.record is not None and snapshot.record.state is JobState.RESTARTING:
            wake = min(wake, time.monotonic() + 0.05)  # the real one is woken by each node_ready
        time.sleep(max(0.0, wake - time.monotonic()))
    memory1 = int(client.info("memory")["used_memory"])
    others.join()
    (t0, cpu0, calls0, rounds0), (t1, cpu1, calls1, rounds1) = window
    elapsed = t1 - t0
    kept_up = (rounds1 - rounds0) / elapsed >= 0.95
    return {
        "nodes": nodes,
        "killed": kill,
        "simulator_kept_up": kept_up,  # every follower heartbeat once a second, or no figures
        **(phases(store, deadlines, kill_at) if kept_up else {}),
        "leader_sync_ms": {
            "median": round(statistics.median(rtts) * 1000, 2),
            "max": round(max(rtts) * 1000, 2),
        },
        "steady_window_s": round(elapsed, 1),
        "follower_rounds_per_s": round((rounds1 - rounds0) / elapsed, 2),
        "redis_cpu_percent": round((cpu1 - cpu0) / elapsed * 100, 1),
        "redis_commands_per_s_incl_lua": round((calls1 - calls0) / elapsed),
        "redis_commands_per_node_per_s": round((calls1 - calls0) / elapsed / nodes, 2),
        "redis_bytes_per_node": round((memory1 - memory0) / nodes),
        "report_bytes": len(report(names[-1], 1).to_json()),
    }


def phases(store: JobStore, deadlines: dict[str, float], kill_at: float) -> dict[str, Any]:
    """Deadline -> noticed, -> next generation announced, -> started (server time)."""
    events = [e for e in store.events("-", count=100_000) if (e.at_ms or 0) / 1000 >= kill_at]
    first = min(deadlines.values(), default=0.0)
    lost = {e.node: (e.at_ms or 0) / 1000 for e in events if e.type == "node_lost"}
    detections = [lost[n] - d for n, d in deadlines.items() if n in lost]

    def after(kind: str) -> float | None:
        at = [(e.at_ms or 0) / 1000 for e in events if e.type == kind]
        return round(min(at) - first, 3) if at else None

    return {
        "detected": f"{len(detections)}/{len(deadlines)}",
        "detection_after_deadline_s": {
            "median": round(statistics.median(detections), 3) if detections else None,
            "max": round(max(detections), 3) if detections else None,
        },
        "announced_after_deadline_s": after("generation_announced"),
        "started_after_deadline_s": after("generation_started"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="100,1000,5000,10000")
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
