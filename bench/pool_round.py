"""The pool leader's round alone: read the pool, schedule(), commit, at M nodes.

    .venv/bin/python bench/pool_round.py [--nodes 1000,5000,10000] [--jobs 100] [--rounds 30]

fleet.py runs the pool leader's round in a process that also runs 100 job leaders and shares
two cores with the simulated nodes and Redis, so its round figures are this machine's load as
much as the round. Here, on a real redis-server and nothing else running: J jobs submitted
pinned, M pool nodes (node i pinned to job i mod J, serving it) with long leases, each job's
record RUNNING on its nodes (written as its leader would), then R rounds of
`nodeagent.pool.leadership.lead` by node 0, the pool leader, with nothing changing between them (the
steady state: every round reads the page of changed nodes and the sweep, and writes nothing).
Each round is split into the read (`read_view`: the pool's hashes, the node pages, the specs and
the records that moved) and `schedule()`; Redis time of the read is the sum of the round's
EVALSHA calls in SLOWLOG (at 0 µs). Medians and maxima in ms. Writes
bench/results/pool-round.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.sizes import each_size  # noqa: E402
from nodeagent.coord.client import connect  # noqa: E402
from nodeagent.coord.keys import PoolKeys  # noqa: E402
from nodeagent.coord.pool import PoolStore  # noqa: E402
from nodeagent.coord.store import JobStore  # noqa: E402
from nodeagent.job.plan import LeaderMemory, Plan  # noqa: E402
from nodeagent.model.job import NodeReport  # noqa: E402
from nodeagent.model.pool import PoolNode  # noqa: E402
from nodeagent.model.spec import load_spec  # noqa: E402
from nodeagent.pool import leadership as pool_leadership  # noqa: E402
from nodeagent.pool.schedule import SchedulePolicy, schedule  # noqa: E402
from nodeagent.state import JobState, NodeState  # noqa: E402
from tests.helpers.cluster import RedisServer  # noqa: E402
from tests.helpers.factories import make_record  # noqa: E402

PREFIX, POOL = "nodeagent", "bench"
LEASE_MS = 600_000  # no lease lapses during the run
BATCH = 1000


def pool_node(name: str, job: str) -> PoolNode:
    return PoolNode(
        name=name,
        address="10.0.0.1",
        lease_ttl_ms=LEASE_MS,
        labels={"gpu": "h100"},
        pinned=job,
        serving=job,
        metrics="10.0.0.1:9410",
        version="bench",
    )


def setup(server: RedisServer, nodes: int, jobs: int) -> tuple[PoolStore, str]:
    """The pool at `nodes` nodes and `jobs` pinned jobs; its store and leader value."""
    pool = PoolStore(connect(server.url, 60.0), PoolKeys(PREFIX, f"{POOL}{nodes}"))
    names = [f"n{i:05d}" for i in range(nodes)]
    job_ids = [f"job{nodes}-{j:03d}" for j in range(jobs)]
    for job in job_ids:
        size = len(names[int(job.rsplit("-", 1)[1]) :: jobs])
        spec = {
            "id": job,
            "entrypoint": ["python", "train.py"],
            "user": "bench",
            "nproc_per_node": 8,
            "min_nodes": 1,
            "max_nodes": size,
            "target_nodes": size,
        }
        pool.submit(load_spec(spec), pinned=True)
    beat = pool.sync(pool_node(names[0], job_ids[0]))
    assert beat.leader is not None and beat.leader_name == names[0]
    reports = [pool_node(name, job_ids[i % jobs]) for i, name in enumerate(names)]
    for i in range(0, nodes, BATCH):
        pool.sync_many(reports[i : i + BATCH])
    for j, job in enumerate(job_ids):  # each job's record, as its leader writes it
        store = JobStore(pool.client, pool.keys.job(job))
        members = tuple(names[j::jobs])
        first = NodeReport(members[0], "10.0.0.1", NodeState.READY, lease_ttl_ms=LEASE_MS)
        snap = store.sync(first)
        assert snap.leader is not None
        record = make_record(JobState.RUNNING, 1, members, target_nodes=len(members))
        store.commit(snap.leader, snap.rev, Plan(record, (), (), LeaderMemory(), "bench"))
    return pool, beat.leader


def rounds(pool: PoolStore, leader: str, count: int) -> dict[str, Any]:
    client, views = pool.client, pool_leadership.NodeViews()
    for _ in range(3):  # the first reads everything (a new term); then the steady state
        pool_leadership.lead(pool, leader, SchedulePolicy(), views)
    whole, read, decide, redis_ms = [], [], [], []
    for _ in range(count):
        client.config_set("slowlog-log-slower-than", 0)
        client.slowlog_reset()
        began = time.perf_counter()
        result = pool_leadership.lead(pool, leader, SchedulePolicy(), views)
        whole.append(time.perf_counter() - began)
        calls = client.slowlog_get(128)
        client.config_set("slowlog-log-slower-than", 10_000)
        redis_ms.append(sum(e["duration"] for e in calls if e["command"].startswith(b"EVAL")))
        assert result.write is None, "the steady state writes nothing"
        began = time.perf_counter()
        _, view, _, _ = pool_leadership.read_view(pool, leader, views)
        read.append(time.perf_counter() - began)
        began = time.perf_counter()
        schedule(view, SchedulePolicy())
        decide.append(time.perf_counter() - began)

    def ms(values: list[float], scale: float = 1000.0) -> dict[str, float]:
        return {
            "median": round(statistics.median(values) * scale, 2),
            "max": round(max(values) * scale, 2),
        }

    return {
        "round_ms": ms(whole),
        "read_view_ms": ms(read),
        "schedule_ms": ms(decide),
        "redis_ms_per_round": ms(redis_ms, 1 / 1000),
        "nodes_read_last_round": pool.last_read,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="1000,5000,10000")
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "pool-round.json"))
    args = parser.parse_args()

    def measure(server: RedisServer, nodes: int) -> dict[str, Any]:
        pool, leader = setup(server, nodes, args.jobs)
        return {"nodes": nodes, "jobs": args.jobs, **rounds(pool, leader, args.rounds)}

    each_size((int(n) for n in args.nodes.split(",")), measure, Path(args.out))


if __name__ == "__main__":
    main()
