"""nodeagentctl jobs: the pool's jobs, their state, queue position, world and why."""

from __future__ import annotations

import argparse
import json
from typing import Any

from nodeagent.cli.ctl.output import listing, rfc3339
from nodeagent.cli.ctl.targets import Target
from nodeagent.coord.pool import PoolSnapshot
from nodeagent.model.job import JobRecord
from nodeagent.model.pool import PoolJob, PoolJobState
from nodeagent.model.spec import JobSpec
from nodeagent.pool.leadership import read_view
from nodeagent.pool.schedule import PoolView

HELP = "the pool's jobs: state, queue position, world"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--user", help="only the jobs that run as this user")
    parser.add_argument(
        "--state", choices=[s.value for s in PoolJobState], help="only the jobs in this state"
    )


def run(target: Target, args: argparse.Namespace) -> int:
    store = target.pool_store
    snap, view, records = read_view(store)
    specs = store.specs(list(snap.jobs))
    running = [j for j, s in snap.jobs.items() if s.state is PoolJobState.RUNNING]
    records.update(store.records(j for j in running if j not in records))  # stale pinned jobs
    pending = sorted(
        (j for j in view.jobs.values() if j.status.state is PoolJobState.PENDING),
        key=lambda j: j.order,
    )
    positions = {job.id: i + 1 for i, job in enumerate(pending)}
    rows = [
        _job_row(j, s, snap, view, records.get(j) if j in running else None, positions.get(j))
        for j, s in snap.jobs.items()
    ]
    for row in rows:
        spec = specs.get(row["job"])
        row["user"] = spec.user if isinstance(spec, JobSpec) else None
        row["submitted_by"] = spec.submitted_by if isinstance(spec, JobSpec) else None
    rows = [
        r
        for r in rows
        if (args.user is None or r["user"] == args.user)
        and (args.state is None or r["state"] == args.state)
    ]
    rows.sort(key=lambda r: (_STATE_ORDER[r["state"]], r["position"] or 0, -r["seq"]))
    if args.json:
        print(json.dumps(listing("jobs", store.keys.pool, rows), indent=2))
        return 0
    print(
        f"{'JOB':<24} {'USER':<12} {'STATE':<10} {'POS':>3} {'PRIO':>4} {'QUEUE':<10} {'WORLD':>5} "
        f"{'NODES':>9} {'RESTARTS':>8} {'AGE':>7}  REASON"
    )
    for r in rows:
        nodes = f"{r['nodes']}/{r['target_nodes'] if r['target_nodes'] is not None else '-'}"
        restarts = "-" if r["restarts"] is None else str(r["restarts"])
        print(
            f"{r['job']:<24} {r['user'] or '-':<12} {r['state']:<10} {r['position'] or '-'!s:>3} "
            f"{r['priority'] if r['priority'] is not None else '-'!s:>4} "
            f"{r['queue'] or '-':<10} {r['world_size']:>5} {nodes:>9} {restarts:>8} "
            f"{_age(r['age_s']):>7}  {r['reason']}"
        )
    return 0


_STATE_ORDER = {
    s.value: 0 if s is PoolJobState.RUNNING else 1 if not s.ended else 2 for s in PoolJobState
}


def _job_row(
    job_id: str,
    status: PoolJob,
    snap: PoolSnapshot,
    view: PoolView,
    record: JobRecord | None,
    position: int | None,
) -> dict[str, Any]:
    jobview = view.jobs.get(job_id)
    return {
        "job": job_id,
        "state": status.state.value,
        "position": position,
        "seq": status.seq,
        "priority": jobview.priority if jobview else None,
        "queue": jobview.queue if jobview else None,
        "world_size": record.world_size if record else 0,
        "generation": record.generation if record else None,
        "nodes": len(snap.placements_of(job_id)),
        "target_nodes": jobview.target_nodes if jobview else None,
        "restarts": record.restart_count if record else None,
        "age_s": (snap.now_ms - status.submitted_ms) / 1000,
        "submitted": rfc3339(status.submitted_ms),
        "started": rfc3339(status.admitted_ms),
        "ended": rfc3339(status.ended_ms),
        "reason": status.reason,
        "pinned": status.pinned,
    }


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.0f}h"
