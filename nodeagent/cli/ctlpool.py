"""nodeagentctl's pool commands: jobs, nodes, cancel, submit (cli/ctlsubmit.py), and the
pool side of scale and cordons.

Every argument is checked before anything is written: a cancel of a job that does not exist
or has ended exits 2 and leaves Redis as it was.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from typing import Any

from nodeagent.cli import ctlargs, ctlsubmit, ctlwait
from nodeagent.cli.ctlshow import listing, rfc3339
from nodeagent.coord.pool import PoolSnapshot, PoolStore
from nodeagent.errors import NotFoundError, UsageError
from nodeagent.model.job import Cordon, JobRecord
from nodeagent.model.pool import PoolJob, PoolJobState
from nodeagent.model.spec import JobSpec
from nodeagent.pool import requests
from nodeagent.pool.leadership import read_view
from nodeagent.pool.schedule import PoolView

COMMANDS = frozenset({"submit", "jobs", "nodes", "cancel"})


def add_parsers(commands: Any) -> None:
    ctlsubmit.add_parser(commands)
    jobs = commands.add_parser("jobs", help="the pool's jobs: state, queue position, world")
    jobs.add_argument("--json", action="store_true")
    jobs.add_argument("--user", help="only the jobs that run as this user")
    jobs.add_argument(
        "--state", choices=[s.value for s in PoolJobState], help="only the jobs in this state"
    )
    nodes = commands.add_parser("nodes", help="the pool's nodes: job, health, cordon, labels")
    nodes.add_argument("--json", action="store_true")
    cancel = commands.add_parser("cancel", help="end a job (its workers get the stop grace)")
    cancel.add_argument("job_id", metavar="JOB", type=ctlargs.name)


def run(store: PoolStore, args: argparse.Namespace, user: str, by: str) -> int:
    if args.command == "submit":
        return ctlsubmit.run(store, args, user, by)
    if args.command == "jobs":
        return _jobs(store, args)
    if args.command == "nodes":
        return _nodes(store, args.json)
    return _cancel(store, args.job_id, by)


def _cancel(store: PoolStore, job_id: str, by: str) -> int:
    status = store.status(job_id)
    if status is None:
        raise NotFoundError(f"no job {job_id!r} in pool {store.keys.pool} (see nodeagentctl jobs)")
    if status.state.ended:
        raise UsageError(f"job {job_id} has ended already ({status.state.value})")
    if status.pinned:
        raise UsageError(
            f"job {job_id} comes from its nodes' job: sections; stop it with "
            f"`nodeagentctl --job {job_id} stop`"
        )
    store.cancel(job_id, by, running=status.state is PoolJobState.RUNNING)
    print(f"job {job_id}: cancel requested")
    return 0


def pool_cordon(store: PoolStore, args: argparse.Namespace, by: str) -> int:
    """cordon, drain and uncordon of a node of the pool (no --job): no new job is placed on a
    cordoned node; a drained one also leaves its job now (its workers get the stop grace).

    Raises:
        UsageError: the node is not in the pool.
    """
    snap = store.read()
    name = args.node
    if name not in snap.deadlines and name not in snap.placements and name not in snap.cordons:
        known = ", ".join(sorted(snap.deadlines)) or "none"
        raise NotFoundError(f"node {name!r} is not in pool {store.keys.pool} (its nodes: {known})")
    if args.command == "uncordon":
        lifted = store.uncordon(name, by)
        print(f"node {name}: " + ("uncordoned" if lifted else "was not cordoned"))
        return 0
    drain = args.command == "drain"
    store.cordon(name, Cordon(reason=args.reason, by=by, drain=drain))
    print(f"node {name}: {'drained' if drain else 'cordoned'} in pool {store.keys.pool}")
    if not drain or not args.wait:
        return 0
    return ctlwait.wait_drained(store, name, args.timeout)


def pool_scale_check(store: PoolStore, job_id: str, value: str) -> int | None:
    """`scale JOB N` of a pool job: refuse an unknown or ended one, set the target of a
    pending one (in its spec); None when the job runs (scaled through its own commands).

    Raises:
        UsageError: the job has ended, or N is outside its bounds.
    """
    status = store.status(job_id)
    if status is None:
        return None  # not a pool job: the job's own keys decide
    if status.state.ended:
        raise UsageError(f"cannot scale job {job_id}: it has ended ({status.state.value})")
    if status.state is not PoolJobState.PENDING:
        return None
    spec = store.spec(job_id)
    if not isinstance(spec, JobSpec):
        raise UsageError(f"cannot scale job {job_id}: its spec cannot be read ({spec})")
    job = spec.job
    target = resolve_target(value, job.target_nodes)
    if not job.min_nodes <= target <= job.max_nodes:
        raise UsageError(
            f"cannot scale job {job_id} to {target}: the target must be within "
            f"[min_nodes, max_nodes] = [{job.min_nodes}, {job.max_nodes}]"
        )
    store.replace_spec(replace(spec, job=replace(job, target_nodes=target)))
    print(f"job {job_id} (pending): target {job.target_nodes} -> {target}")
    return 0


def resolve_target(value: str, current: int) -> int:
    """N, or Arena's relative +K / -K from the current target.

    Raises:
        UsageError: not a whole number.
    """
    try:
        return requests.resolve_target(value, current)
    except requests.Refused as exc:
        raise UsageError(str(exc)) from None


def _jobs(store: PoolStore, args: argparse.Namespace) -> int:
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


def _nodes(store: PoolStore, as_json: bool) -> int:
    snap = store.read()
    rows: list[dict[str, Any]] = []
    for name, deadline in sorted(snap.deadlines.items()):
        report = snap.nodes.get(name)
        ttl = report.lease_ttl_ms if report else 0
        cordon = snap.cordons.get(name)
        rows.append(
            {
                "name": name,
                "alive": report is not None,
                "job": snap.placements.get(name),
                "serving": report.serving if report else None,
                "health": (report.unfit or "ok") if report else "lost",
                "cordon": cordon.reason if cordon else None,
                "labels": dict(report.labels) if report else {},
                "heartbeat_age_s": (snap.now_ms - (deadline - ttl)) / 1000 if report else None,
                "address": report.address if report else None,
            }
        )
    if as_json:
        print(json.dumps(listing("nodes", store.keys.pool, rows), indent=2))
        return 0
    print(f"{'NODE':<20} {'JOB':<24} {'HEALTH':<10} {'HB AGE':>7}  {'CORDON':<12} LABELS")
    for r in rows:
        labels = ",".join(f"{k}={v}" for k, v in sorted(r["labels"].items())) or "-"
        age = "-" if r["heartbeat_age_s"] is None else f"{r['heartbeat_age_s']:.1f}s"
        health = r["health"] if len(r["health"]) <= 10 else r["health"][:9] + "~"
        print(
            f"{r['name']:<20} {r['job'] or '(free)':<24} {health:<10} {age:>7}  "
            f"{r['cordon'] or '-':<12} {labels}"
        )
    return 0


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.0f}h"
