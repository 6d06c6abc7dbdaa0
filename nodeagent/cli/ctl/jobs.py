"""nodeagentctl jobs: the pool's jobs, their state, queue position, world and why."""

from __future__ import annotations

import argparse
import json

from nodeagent.cli.ctl.targets import Target
from nodeagent.model.pool import PoolJobState
from nodeagent.views import jobs as views
from nodeagent.views.documents import listing

HELP = "the pool's jobs: state, queue position, world"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--user", help="only the jobs that run as this user")
    parser.add_argument(
        "--state", choices=[s.value for s in PoolJobState], help="only the jobs in this state"
    )
    parser.add_argument("--queue", help="only the jobs of this queue")
    parser.add_argument("--array", help="only the tasks of this array (as squeue -j ARRAY)")


def run(target: Target, args: argparse.Namespace) -> int:
    store = target.pool_store
    rows = views.jobs(store, args.user, args.state, args.queue, args.array)
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


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.0f}h"
