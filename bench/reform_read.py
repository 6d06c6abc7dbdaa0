"""What a re-form costs Redis in records sent: every node reads the new record once.

    .venv/bin/python bench/reform_read.py [--nodes 1000,5000,10000]

fleet.py's simulated followers share one read of each new record per process, so its figures
leave out what real agents do at a re-form: each of the M nodes reads the record (SYNC sends it
when its revision moved). Here, on a real redis-server, one job's record at generation g with M
members is written as a leader writes it (the members in a new order, so COMMIT rewrites every
rank), and then M followers' SYNC calls holding the previous revision are sent, pipelined (1,000
a pipeline, from this one process), as they would be in the round after the announcement.

Per M: the record's size and its head's; the leader's COMMIT in Redis time (SLOWLOG), with the
ranks rewritten and without; and for three rounds of M calls, Redis CPU (INFO used_cpu_sys+user),
bytes sent (INFO total_net_output_bytes) and wall time (client side: it includes this process
reading the replies):
- reform_round: each follower gets the record's head and its rank (what nodeagent does);
- whole_round: each gets the whole record, as before heads (the ranks hash deleted: the fallback);
- steady_round: each holds the record already (a heartbeat).
Writes bench/results/reform-read.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.sizes import each_size  # noqa: E402
from nodeagent.coord.client import connect  # noqa: E402
from nodeagent.coord.keys import JobKeys  # noqa: E402
from nodeagent.coord.store import JobStore  # noqa: E402
from nodeagent.job.plan import LeaderMemory, Plan  # noqa: E402
from nodeagent.model.job import JobRecord, NodeReport  # noqa: E402
from nodeagent.state import JobState, NodeState  # noqa: E402
from tests.helpers.cluster import RedisServer  # noqa: E402
from tests.helpers.factories import make_record  # noqa: E402

BATCH = 1000


def report(name: str) -> NodeReport:
    return NodeReport(
        name=name, address="10.0.0.1", state=NodeState.READY, free_port=1, lease_ttl_ms=60_000
    )


def totals(client: Any) -> tuple[float, int]:
    cpu = client.info("cpu")
    stats = client.info("stats")
    return float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]), int(
        stats["total_net_output_bytes"]
    )


def round_of(store: JobStore, reports: list[NodeReport], held: str) -> dict[str, float]:
    client = store.client
    cpu0, out0 = totals(client)
    began = time.perf_counter()
    for i in range(0, len(reports), BATCH):
        store.sync_many(reports[i : i + BATCH], held=held)
    wall = time.perf_counter() - began
    cpu1, out1 = totals(client)
    return {
        "wall_s": round(wall, 3),
        "redis_cpu_s": round(cpu1 - cpu0, 3),
        "sent_mb": round((out1 - out0) / 1e6, 1),
    }


def commit_ms(store: JobStore, leader: str, rev: int, record: JobRecord) -> tuple[int, list[float]]:
    """The new revision, and the Redis time in ms of each script call of the commit (SLOWLOG
    at 0: every call): the ranks' pages (WRITE_RANKS) when the members changed, then COMMIT."""
    client = store.client
    client.config_set("slowlog-log-slower-than", 0)
    client.slowlog_reset()
    new_rev = store.commit(leader, rev, Plan(record, (), (), LeaderMemory(), "bench"))
    calls = [e for e in client.slowlog_get(64) if e["command"].startswith(b"EVALSHA")]
    client.config_set("slowlog-log-slower-than", 10_000)
    return new_rev, [e["duration"] / 1000 for e in reversed(calls)]


def run(server: RedisServer, nodes: int) -> dict[str, Any]:
    keys = JobKeys("nodeagent", f"reform-{nodes}")
    store = JobStore(connect(server.url, 60.0), keys)
    names = [f"n{i:05d}" for i in range(nodes)]
    snap = store.sync(report(names[0]))
    assert snap.leader is not None
    leader = snap.leader

    def record(gen: int, members: tuple[str, ...]) -> JobRecord:
        return make_record(JobState.RUNNING, gen, members, target_nodes=nodes, max_nodes=nodes)

    rev, _ = commit_ms(store, leader, snap.rev, record(1, tuple(names)))
    reports = [report(name) for name in names[1:]]
    round_of(store, reports, str(rev))  # the nodes exist, their change marks made
    new = record(2, (names[0], *reversed(names[1:])))  # every rank but 0 moves
    rev, ranks_ms = commit_ms(store, leader, rev, new)
    reform = round_of(store, reports, str(rev - 1))
    rev, same_ms = commit_ms(store, leader, rev, replace(new, reason="same members"))
    store.client.delete(keys.ranks)  # the fallback: every follower reads the whole record
    whole = round_of(store, reports, str(rev - 1))
    return {
        "nodes": nodes,
        "record_bytes": len(new.to_json()),
        "head_bytes": len(new.head_json()),
        "commit_calls_ms_new_members": ranks_ms,
        "commit_calls_ms_same_members": same_ms,
        "reform_round": reform,
        "whole_round": whole,
        "steady_round": round_of(store, reports, str(rev)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="1000,5000,10000")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "reform-read.json"))
    args = parser.parse_args()
    each_size((int(n) for n in args.nodes.split(",")), run, Path(args.out))


if __name__ == "__main__":
    main()
