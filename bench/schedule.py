"""The pool scheduler's pure decision: how long one `schedule(view, policy)` call takes.

    .venv/bin/python bench/schedule.py [--quick] [--seed 1]

No Redis, no agents: the pool leader's decision alone (nodeagent.pool.schedule), on pool views
built the way the leader builds them, with a seeded random mix. In every scenario about 5 % of
the nodes cannot take a job: 2 % unfit (their GPUs), 2 % cordoned, 1 % refusing one to three
jobs (they still serve others). Running jobs' targets are drawn from 1-32 nodes (mostly 4-16)
and scaled so that together they take 92 % of the usable nodes (1 to about 50 nodes each);
their nodes are consecutive names, as schedule() gives them.

- steady-1k: 1,000 nodes, 100 jobs, every one running at its target: nothing to change (the
  run checks that the decision changes nothing);
- mixed-1k: 1,000 nodes, 100 jobs: 60 running (a fifth of them below target, so they grow), 40
  pending with min_nodes 1-32, some admitted, some backfilled, some that do not fit the free
  nodes; none has waited reserve_after, so no reservation and every step runs;
- mixed-10k: the same mix at 10,000 nodes and 1,000 jobs (600 running, 400 pending), to show
  how it scales;
- gpus-1k: 1,000 nodes of 8 GPUs and 5,000 jobs (issue 66): 50 whole-node jobs of 4 nodes
  running, 4,000 jobs of 1, 2 or 4 GPUs (weighted 75:20:5) packed onto the
  other nodes, first fit, to about 85 % of their units, and 950 pending (900 asking for GPUs,
  50 for 1-8 whole nodes): some packed into what is free, the rest waiting. Each node says
  its memory for jobs (issue 80), and a tenth of the jobs sharing nodes ask for a quarter
  more than a GPU's default share of it, so memory is counted in every packing;
- queue-1k: 1,000 nodes, 100 jobs running and a queue of 10,000 pending (issue 63's pool: an
  API's submissions wait there), min_nodes 1-32: a few are admitted, the rest wait; most
  share a shape (queue, size, priority) with a job before them that could not start.

Each call is timed alone (time.perf_counter) after one warm-up call, on the same view, up to
--reps calls or --budget seconds per scenario (at least 3 calls), gc on as in the leader;
median, p90 and max in ms; also this thread's CPU time per call (time.thread_time), which
other processes on a busy machine inflate less. The load average at the start is recorded.
The goals: under 50 ms per decision at 1,000 nodes and 100 jobs (the pool issue), and at
1,000 nodes x 8 GPUs with 5,000 jobs (issue 66). It is a
figure printed here, never asserted in a test. Writes bench/results/schedule.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nodeagent.model.pool import PoolJob, PoolJobState  # noqa: E402
from nodeagent.pool.schedule import (  # noqa: E402
    JobView,
    NodeView,
    PoolView,
    SchedulePolicy,
    schedule,
)
from nodeagent.runtime import tuning  # noqa: E402
from nodeagent.state import JobState  # noqa: E402

NOW_MS = 1_800_000_000_000
POLICY = SchedulePolicy()  # reserve_after 300 s, the default
GOAL_MS = 50.0
SIZES = (1, 2, 4, 8, 16, 32)  # nodes per running job, weighted below (mean about 9)
SIZE_WEIGHTS = (10, 15, 25, 25, 15, 10)
PENDING_MIN = (1, 2, 4, 8, 12, 16, 24, 32)  # a pending job's min_nodes
FILL = 0.92  # share of the usable nodes the running jobs' targets take


@dataclass(frozen=True)
class Scenario:
    name: str
    nodes: int
    jobs: int
    pending: int
    below_target: float  # share of the running jobs that run below their target
    what: str


SCENARIOS = (
    Scenario("steady-1k", 1_000, 100, 0, 0.0, "all running at target, nothing to change"),
    Scenario("mixed-1k", 1_000, 100, 40, 0.2, "60 running (a fifth below target), 40 pending"),
    Scenario("mixed-10k", 10_000, 1_000, 400, 0.2, "600 running (a fifth below), 400 pending"),
    Scenario("gpus-1k", 1_000, 5_000, 950, 0.0, "1,000 x 8 GPUs: 4,050 running, 950 pending"),
    Scenario("queue-1k", 1_000, 10_100, 10_000, 0.0, "100 running, a queue of 10,000 pending"),
)
GPUS = 8  # a node's, in gpus-1k
GPU_ASKS, GPU_WEIGHTS = (1, 2, 4), (75, 20, 5)  # a shared job's gpus_per_node
# gpus-1k's nodes: 2 TiB less the 10 % reserve for jobs, a GPU's default share an eighth; a
# tenth of the jobs sharing them ask for more than that share per GPU (mem_per_gpu)
MEMORY = (2 << 40) * 9 // 10
MEM_ASK = MEMORY // GPUS * 5 // 4


def build_gpus(sc: Scenario, rng: random.Random) -> PoolView:
    """gpus-1k: whole-node jobs, jobs sharing nodes by GPUs, and both kinds pending."""
    names = [f"gpu-{i:05d}" for i in range(sc.nodes)]
    bad = rng.sample(range(sc.nodes), k=sc.nodes // 20)
    base = NodeView("", gpus=GPUS, memory=MEMORY, mem_per_gpu=MEMORY // GPUS)
    nodes = {n: replace(base, name=n) for n in names}
    for i in bad[: sc.nodes // 50]:
        nodes[names[i]] = replace(base, name=names[i], unfit="2 of 8 GPUs usable (xid 79)")
    for i in bad[sc.nodes // 50 :]:
        nodes[names[i]] = replace(base, name=names[i], cordoned="rack maintenance (ops@example)")
    free = [n for n in names if nodes[n].eligible]
    jobs: dict[str, JobView] = {}
    placements: dict[str, str] = {}
    shares: dict[str, dict[str, int]] = {}
    seq = 0

    def add(job_id: str, state: PoolJobState, nodes_: int, gpus: int | None) -> None:
        nonlocal seq
        seq += 1
        running = state is PoolJobState.RUNNING
        status = PoolJob(
            state,
            seq=seq,
            submitted_ms=NOW_MS - (3_600_000 if running else rng.randint(0, 299_000)),
            admitted_ms=NOW_MS - 3_000_000 if running else None,
        )
        jobs[job_id] = JobView(
            job_id,
            status,
            nodes_,
            nodes_,
            nodes_,
            priority=rng.choice((0, 0, 0, 1)),
            record_state=JobState.RUNNING if running else None,
            gpus_per_node=gpus,
            mem_per_gpu=MEM_ASK if gpus is not None and rng.random() < 0.1 else None,
        )

    for i in range(50):  # whole-node jobs, 4 nodes each
        job_id = f"whole-{i:04d}"
        took, free = free[:4], free[4:]
        placements.update((n, job_id) for n in took)
        add(job_id, PoolJobState.RUNNING, 4, None)
    running_shared = sc.jobs - sc.pending - 50
    node, room = 0, GPUS
    for i in range(running_shared):  # first fit onto the free nodes left
        job_id = f"small-{i:05d}"
        units = rng.choices(GPU_ASKS, weights=GPU_WEIGHTS)[0]
        if units > room:
            node, room = node + 1, GPUS
        shares.setdefault(free[node], {})[job_id] = units
        room -= units
        add(job_id, PoolJobState.RUNNING, 1, units)
    for i in range(sc.pending - 50):
        add(f"wait-{i:05d}", PoolJobState.PENDING, 1, rng.choices(GPU_ASKS, GPU_WEIGHTS)[0])
    for i in range(50):
        add(f"big-{i:04d}", PoolJobState.PENDING, rng.randint(1, 8), None)
    return PoolView(NOW_MS, nodes, jobs, placements, shares=shares)


def build(sc: Scenario, rng: random.Random) -> PoolView:
    """A pool view as the leader would read it for `sc`."""
    names = [f"gpu-{i:05d}" for i in range(sc.nodes)]
    job_ids = [f"job-{i:04d}" for i in range(sc.jobs)]
    bad = rng.sample(range(sc.nodes), k=sc.nodes // 20)
    unfit, cordoned = bad[: sc.nodes // 50], bad[sc.nodes // 50 : sc.nodes // 25]
    refusing = bad[sc.nodes // 25 :]
    nodes = {n: NodeView(n) for n in names}
    for i in unfit:
        nodes[names[i]] = NodeView(names[i], unfit="2 of 8 GPUs usable (xid 79)")
    for i in cordoned:
        nodes[names[i]] = NodeView(names[i], cordoned="rack maintenance (ops@example)")
    for i in refusing:
        refused = dict.fromkeys(rng.sample(job_ids, k=rng.randint(1, 3)), "bench")
        nodes[names[i]] = NodeView(names[i], refused=refused)

    running = sc.jobs - sc.pending
    usable = sum(1 for n in nodes.values() if n.eligible)
    sizes = rng.choices(SIZES, weights=SIZE_WEIGHTS, k=running)
    scale = FILL * usable / max(1, sum(sizes))
    targets = [max(1, round(s * scale)) for s in sizes]
    below = set(rng.sample(range(running), k=int(running * sc.below_target)))

    jobs: dict[str, JobView] = {}
    placements: dict[str, str] = {}
    free = [n for n in names if nodes[n].eligible]
    for i, (job_id, target) in enumerate(zip(job_ids, targets, strict=False)):
        size = target - rng.randint(1, min(4, target - 1)) if i in below and target > 1 else target
        took = [n for n in free if job_id not in nodes[n].refused][:size]
        free = [n for n in free if n not in set(took)]
        placements.update((n, job_id) for n in took)
        status = PoolJob(
            PoolJobState.RUNNING,
            seq=i + 1,
            submitted_ms=NOW_MS - 3_600_000,
            reason=f"admitted on {len(took)} nodes",
            admitted_ms=NOW_MS - 3_000_000,
        )
        jobs[job_id] = JobView(
            job_id,
            status,
            min_nodes=max(1, min(len(took), target // 2)),
            max_nodes=target,
            target_nodes=target,
            priority=rng.choice((0, 0, 0, 1)),
            record_state=JobState.RUNNING,
            members=tuple(took),
        )
    for i, job_id in enumerate(job_ids[running:], start=running):
        min_nodes = rng.choice(PENDING_MIN)
        status = PoolJob(
            PoolJobState.PENDING,
            seq=i + 1,
            submitted_ms=NOW_MS - rng.randint(0, POLICY.reserve_after_ms - 1),
        )
        target = min_nodes * rng.choice((1, 1, 2))
        jobs[job_id] = JobView(
            job_id,
            status,
            min_nodes=min_nodes,
            max_nodes=target,
            target_nodes=target,
            priority=rng.choice((0, 0, 0, 1)),
        )
    return PoolView(NOW_MS, nodes, jobs, placements)


def describe(view: PoolView) -> dict[str, Any]:
    """What the view holds and what one decision does with it (the warm-up call)."""
    result = schedule(view, POLICY)
    states = [s.state.value for s in result.jobs.values()]
    return {
        "nodes": len(view.nodes),
        "jobs": len(view.jobs),
        "nodes_unfit_cordoned_refusing": sum(
            1 for n in view.nodes.values() if n.unfit or n.cordoned or n.refused
        ),
        "placed_before": len(view.placements),
        "placed_after": len(result.placements),
        "jobs_admitted": states.count(PoolJobState.RUNNING.value),
        "jobs_still_pending": sum(
            1
            for j in view.jobs.values()
            if result.jobs.get(j.id, j.status).state is PoolJobState.PENDING
        ),
        "shared_nodes_before": len(view.shares),
        "shared_nodes_after": len(result.shares),
        "changed": result.changed(view.placements, view.shares),
    }


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(view: PoolView, reps: int, budget_s: float) -> tuple[list[float], list[float]]:
    """Milliseconds per schedule() call, wall clock and this thread's CPU time: up to `reps`
    calls or `budget_s` (at least 3)."""
    gc.collect()
    wall: list[float] = []
    cpu: list[float] = []
    started = time.perf_counter()
    while len(wall) < reps and (len(wall) < 3 or time.perf_counter() - started < budget_s):
        t0, c0 = time.perf_counter(), time.thread_time()
        schedule(view, POLICY)
        c1, t1 = time.thread_time(), time.perf_counter()
        wall.append((t1 - t0) * 1000)
        cpu.append((c1 - c0) * 1000)
    return wall, cpu


def figures(values: list[float], prefix: str = "") -> dict[str, float]:
    return {
        f"{prefix}median_ms": round(statistics.median(values), 3),
        f"{prefix}p90_ms": round(quantile(values, 0.9), 3),
        f"{prefix}max_ms": round(max(values), 3),
        f"{prefix}min_ms": round(min(values), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls (a smoke run)")
    parser.add_argument("--reps", type=int, help="calls per scenario (default 200, quick 20)")
    parser.add_argument("--budget", type=float, help="seconds per scenario (default 20, quick 3)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", help="comma-separated scenario names")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "schedule.json"))
    parser.add_argument(
        "--default-gc", action="store_true", help="CPython's gc thresholds, not the agent's"
    )
    args = parser.parse_args()
    if not args.default_gc:
        tuning.tune()  # the interpreter's settings of the agent whose round this is
    reps = args.reps or (20 if args.quick else 200)
    budget = args.budget or (3.0 if args.quick else 20.0)
    chosen = [s for s in SCENARIOS if not args.only or s.name in args.only.split(",")]
    results: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "implementation": platform.python_implementation(),
            "platform": platform.platform(),
            "load_avg_1m_at_start": round(os.getloadavg()[0], 2),
        },
        "date": time.strftime("%Y-%m-%d"),
        "seed": args.seed,
        "quick": args.quick,
        "goal_ms": {"steady-1k": GOAL_MS, "mixed-1k": GOAL_MS, "gpus-1k": GOAL_MS},
        "scenarios": {},
    }
    header = f"{'scenario':<10} {'nodes':>6} {'jobs':>5} {'calls':>5} "
    header += f"{'median ms':>10} {'p90 ms':>9} {'max ms':>9} {'cpu med':>9} {'cpu max':>9}"
    print(header + "  what", flush=True)
    for sc in chosen:
        rng = random.Random(f"{args.seed}-{sc.name}")
        view = build_gpus(sc, rng) if sc.name.startswith("gpus") else build(sc, rng)
        facts = describe(view)
        if sc.pending == 0 and facts["changed"]:
            raise SystemExit(f"{sc.name}: the steady view is not steady: {facts}")
        wall, cpu = measure(view, reps, budget)
        got = {**figures(wall), **figures(cpu, "cpu_"), "calls": len(wall)}
        results["scenarios"][sc.name] = {"what": sc.what, **facts, **got}
        print(
            f"{sc.name:<10} {sc.nodes:>6} {sc.jobs:>5} {len(wall):>5} "
            f"{got['median_ms']:>10.2f} {got['p90_ms']:>9.2f} {got['max_ms']:>9.2f} "
            f"{got['cpu_median_ms']:>9.2f} {got['cpu_max_ms']:>9.2f}  {sc.what}",
            flush=True,
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
