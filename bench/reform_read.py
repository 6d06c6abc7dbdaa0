"""What a re-form costs Redis in records sent: every node reads the new record once.

    .venv/bin/python bench/reform_read.py [--nodes 1000,5000,10000]

fleet.py's simulated followers share one read of each new record per process, so its figures
leave out what real agents do at a re-form: each of the M nodes gets the record (SYNC sends it
when its revision moved), and the record names every member, so it grows with M. Here, on a real
redis-server, one job's record at generation g with M members is written as a leader writes it,
and then M followers' SYNC calls holding the previous revision are sent, pipelined (1,000 a
pipeline, from this one process), as they would be in the round after the announcement. Measured
per M: the record's size, Redis CPU for the M calls (INFO used_cpu_sys+user), bytes sent (INFO
total_net_output_bytes) and the wall time of the round (client side: it includes this process
reading the replies). The same M calls holding the new revision (a heartbeat with no record) are
timed for comparison. Writes bench/results/reform-read.json.
"""

from __future__ import annotations

import argparse
import json
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
from nodeagent.leader import LeaderMemory, Plan  # noqa: E402
from nodeagent.model import NodeReport  # noqa: E402
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


def run(server: RedisServer, nodes: int) -> dict[str, Any]:
    keys = JobKeys("nodeagent", f"reform-{nodes}")
    store = JobStore(connect(server.url, 60.0), keys)
    names = [f"n{i:05d}" for i in range(nodes)]
    snap = store.sync(report(names[0]))
    assert snap.leader is not None
    members = tuple(names)
    record = make_record(JobState.RUNNING, 2, members, target_nodes=nodes, max_nodes=nodes)
    rev = store.commit(snap.leader, snap.rev, Plan(record, (), (), LeaderMemory(), "bench"))
    reports = [report(name) for name in names[1:]]
    round_of(store, reports, str(rev))  # the nodes exist, their change marks made
    held_old = str(rev - 1)
    return {
        "nodes": nodes,
        "record_bytes": len(record.to_json()),
        "reform_round": round_of(store, reports, held_old),  # each follower gets the record
        "steady_round": round_of(store, reports, str(rev)),  # each holds it already
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="1000,5000,10000")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "reform-read.json"))
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp))
        server.start()
        try:
            for nodes in (int(n) for n in args.nodes.split(",")):
                row = run(server, nodes)
                print(json.dumps(row), flush=True)
                runs.append(row)
        finally:
            server.stop()
    Path(args.out).write_text(json.dumps({"runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
