"""Submit -> every rank running, on an idle pool of real agents and a real redis-server.

    .venv/bin/python bench/submit.py [--nodes 4] [--job-nodes 2] [--runs 10]

A pool of --nodes agents on this machine (job-less configs, the default 1 s heartbeat and 5 s
lease) waits idle; each run submits a job of --job-nodes nodes with `nodeagentctl submit` and
times, from the moment the submission was stored (its pool status' submitted_ms):
- admitted:  the pool leader placed the job (its pool status' admitted_ms, Redis time);
- formed:    the job's first generation was announced (its record's since_ms);
- spawned:   the last worker process was started (workers_started events);
- running:   every worker printed its first line (the worker writes time.time() first thing:
             what the job's own start-up would begin with).
Then the job's workers exit 0 and the next run starts on the idle pool again. The goal (the
pool issue): submit -> running within one heartbeat plus the workers' own start-up. Medians
and maxima of one run; writes bench/results/submit.json. On one machine Redis time and the
local clock are the same clock.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nodeagent.coord.client import connect  # noqa: E402
from nodeagent.coord.keys import JobKeys, PoolKeys  # noqa: E402
from nodeagent.coord.pool import PoolStore  # noqa: E402
from nodeagent.coord.store import JobStore  # noqa: E402
from tests.helpers.cluster import RedisServer, wait_for  # noqa: E402
from tests.helpers.pool import PoolCluster  # noqa: E402

WORKER = (
    "import os, sys, time; print(time.time(), flush=True); "
    "d = os.environ['BENCH_DIR']; r = os.environ['RANK']; "
    "open(os.path.join(d, 'first-' + r), 'w').write(repr(time.time())); "
    "[time.sleep(0.05) for _ in iter(lambda: os.path.exists(os.path.join(d, 'done')), True)]"
)
PHASES = ("admitted", "formed", "spawned", "running")


def one_run(pool: PoolCluster, store: PoolStore, job: str, nodes: int) -> dict[str, float]:
    bench_dir = pool.directory / job
    bench_dir.mkdir()
    result = pool.ctl(
        "submit", "--name", job, "--nodes", str(nodes), "--env", f"BENCH_DIR={bench_dir}",
        "--", sys.executable, "-c", WORKER,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr

    def started() -> list[Path] | None:
        found = list(bench_dir.glob("first-*"))
        return found if len(found) == nodes else None

    firsts = wait_for(started, 60, f"every rank of {job} running")
    running = max(float(p.read_text()) for p in firsts)
    status = store.read().jobs[job]
    submitted = status.submitted_ms / 1000  # the submit script ran, in Redis time
    job_store = JobStore(store.client, JobKeys("nodeagent", job))
    record = job_store.snapshot().record
    assert record is not None and status.admitted_ms is not None
    spawned = max(
        (e.at_ms or 0) / 1000 for e in job_store.events("-", 1000) if e.type == "workers_started"
    )
    (bench_dir / "done").write_text("")
    wait_for(lambda: store.read().jobs[job].state.ended, 60, f"{job} to end")
    return {
        "admitted": status.admitted_ms / 1000 - submitted,
        "formed": record.since_ms / 1000 - submitted,
        "spawned": spawned - submitted,
        "running": running - submitted,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--job-nodes", type=int, default=2)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "submit.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="nodeagent-bench-submit-") as tmp:
        directory = Path(tmp)
        (directory / "redis").mkdir()
        server = RedisServer(directory / "redis")
        server.start()
        pool = PoolCluster(server.url, directory, pool="bench")
        pool.timing = {"heartbeat_interval": "1s", "lease_ttl": "5s", "join_settle": "0s"}
        client = connect(server.url, 5.0)
        try:
            names = [f"n{i}" for i in range(args.nodes)]
            pool.start(*names)
            wait_for(lambda: len(pool.placements()) == args.nodes, 60, "the pool")
            time.sleep(2)  # idle: every agent past its start-up
            store = PoolStore(client, PoolKeys("nodeagent", "bench"))
            runs = [one_run(pool, store, f"job{i}", args.job_nodes) for i in range(args.runs)]
        finally:
            pool.stop()
            client.close()
            server.stop()
    figures = {
        phase: {
            "median_s": round(statistics.median(r[phase] for r in runs), 3),
            "max_s": round(max(r[phase] for r in runs), 3),
        }
        for phase in PHASES
    }
    print(f"submit -> ... on an idle pool of {args.nodes} nodes, jobs of {args.job_nodes} nodes,")
    print(f"heartbeat 1 s, {args.runs} runs (seconds after the submission was stored):")
    for phase in PHASES:
        figure = figures[phase]
        print(f"  {phase:<9} median {figure['median_s']:6.3f}  max {figure['max_s']:6.3f}")
    doc: dict[str, Any] = {
        "nodes": args.nodes,
        "job_nodes": args.job_nodes,
        "runs": runs,
        "figures": figures,
        "heartbeat_s": 1.0,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "load_avg": os.getloadavg()},
    }  # fmt: skip
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
