"""nodeagentctl scale [JOB] N|+N|-N: a job's target number of nodes. A pending pool job's
target is set in its spec; a running one (and a job of nodes' job: sections) is sent the
command through its own keys, checked against [min_nodes, max_nodes] first. --wait until it
runs at that size, --rollback to the old target if it does not in time."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import Any

from nodeagent.cli.ctl import argtypes, caller, checks, targets, wait
from nodeagent.cli.ctl.targets import Target
from nodeagent.coord.store import Snapshot
from nodeagent.errors import UsageError
from nodeagent.model.job import Command, CommandType
from nodeagent.model.pool import PoolJobState
from nodeagent.model.request import Verb
from nodeagent.model.spec import JobSpec
from nodeagent.pool import jobverbs

HELP = "change a job's target number of nodes: scale [JOB] N, +N or -N"
USAGE = "scale: give [JOB] N, such as `scale llama 4` or `scale llama +2`"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "what",
        nargs="+",
        metavar="[JOB] N",
        help="the job (default --job) and its new target within [min_nodes, max_nodes], or "
        "+N / -N relative to the current one",
    )
    parser.add_argument("--wait", action="store_true", help="wait until the job runs at that size")
    argtypes.timeout(parser)
    parser.add_argument("--rollback", action="store_true", help="on timeout restore the old target")


def request(args: argparse.Namespace, user: str, job: str | None) -> tuple[Verb, dict[str, Any]]:
    if len(args.what) > 2:
        raise UsageError(USAGE)
    named = args.what[0] if len(args.what) == 2 else targets.required(job)
    return Verb.SCALE, {"job": named, "target": args.what[-1]}


def run(target: Target, args: argparse.Namespace) -> int:
    if len(args.what) > 2:
        raise UsageError(USAGE)
    args.value = args.what[-1]
    if len(args.what) == 2:
        target = replace(target, job=argtypes.checked_name(args.what[0], "scale: JOB"))
        handled = _pending(target, args.what[0], args.value)
        if handled is not None:
            return handled
    store = target.store
    snapshot = store.snapshot()
    checks.require_job(store, snapshot)
    return _scale(target, snapshot, args)


def _scale(target: Target, snapshot: Snapshot, args: argparse.Namespace) -> int:
    store, config = target.store, target.config
    pinned = config.job if config is not None and config.job is not None else None
    if pinned is not None and pinned.id != store.keys.job:
        pinned = None
    if snapshot.record is None and pinned is None:
        raise UsageError(
            f"job {store.keys.job} has not formed yet and no --config gives its "
            "bounds; start its agents or pass --config"
        )
    before, args.nodes = _plan(store.keys.job, args.value, False, snapshot.record, pinned)
    store.send_command(Command(CommandType.SCALE, target=args.nodes, by=caller.by()))
    target.confirm("the scale")
    print(f"job {store.keys.job}: target {before} -> {args.nodes} requested")
    if not args.wait or wait.wait_scaled(store, args.nodes, args.timeout):
        return 0
    if args.rollback:
        back = Command(CommandType.SCALE, target=before, by=f"{caller.by()} (rollback)")
        store.send_command(back)
        print(f"rolled back: target {args.nodes} -> {before}", file=sys.stderr)
    return 1


def _pending(target: Target, job_id: str, value: str) -> int | None:
    """`scale JOB N` of a pool job: refuse an unknown or ended one, set the target of a
    pending one (in its spec); None when the job runs (scaled through its own commands).

    Raises:
        UsageError: the job has ended, or N is outside its bounds.
    """
    store = target.pool_store
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
    before, nodes = _plan(job_id, value, True, None, spec.job)
    store.replace_spec(replace(spec, job=replace(spec.job, target_nodes=nodes)))
    target.confirm("the scale")
    print(f"job {job_id} (pending): target {before} -> {nodes}")
    return 0


def _plan(
    job_id: str,
    value: str,
    pending: bool,
    record: jobverbs.Sized | None,
    submitted: jobverbs.Sized | None,
) -> tuple[int, int]:
    """As the pool leader judges it (pool/jobverbs.scale_plan). Raises: UsageError, why not."""
    found = jobverbs.scale_plan(job_id, value, pending, record, submitted)
    if isinstance(found, str):
        raise UsageError(found)
    return found
