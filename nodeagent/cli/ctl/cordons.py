"""What nodeagentctl cordon, drain and uncordon share: a node of the pool (no job given) or of
one job (--job, --config), and their signed form. A job's node must hold a lease or be named by
the job's record; a pool's must be one of the pool's nodes."""

from __future__ import annotations

import argparse
from typing import Any

from nodeagent.cli.ctl import checks, wait
from nodeagent.cli.ctl.targets import Target
from nodeagent.coord.store import JobStore
from nodeagent.errors import NotFoundError
from nodeagent.model.request import Verb
from nodeagent.pool import cordoning


def request(args: argparse.Namespace, job: str | None) -> tuple[Verb, dict[str, Any]]:
    """The signed form: a pool node's (no job), or a job's node."""
    body = {"action": args.command, "node": args.node, "reason": getattr(args, "reason", "")}
    return Verb.CORDON, body if job is None else {**body, "job": job}


def in_job(target: Target, node: str) -> JobStore:
    """The job's store, once the job is known to exist and to name `node`."""
    store = target.store
    snapshot = store.snapshot()
    checks.require_job(store, snapshot)
    checks.require_node(store, snapshot, node, set())
    return store


def in_pool(target: Target, args: argparse.Namespace, by: str) -> int:
    """cordon, drain and uncordon of a node of the pool (no --job): no new job is placed on a
    cordoned node; a drained one also leaves its job now (its workers get the stop grace).

    Raises:
        UsageError: the node is not in the pool.
    """
    store = target.pool_store
    snap = store.read()
    name = args.node
    seen = snap.deadlines.keys() | snap.placements.keys() | snap.shares.keys()
    if name not in seen and name not in snap.cordons:
        known = ", ".join(sorted(snap.deadlines)) or "none"
        raise NotFoundError(f"node {name!r} is not in pool {store.keys.pool} (its nodes: {known})")
    done = cordoning.apply(store, name, args.command, getattr(args, "reason", ""), by)
    target.confirm(f"the {args.command}")
    print(done.said(name, args.command, f" in pool {store.keys.pool}"))
    if args.command != "drain" or not args.wait:
        return 0
    if done.pinned is not None:
        jobs = JobStore(store.client, store.keys.job(done.pinned))
        return wait.wait_job_drained(jobs, name, args.timeout)
    return wait.wait_drained(store, name, args.timeout)
