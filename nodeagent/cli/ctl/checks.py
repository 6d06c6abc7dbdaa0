"""What a job's own verbs check before they write: the job exists, the node named is in it, the
job was not submitted to the pool (for `stop`), and one job given once. Each check raises the
error whose exit code says what is wrong (nodeagentctl's docstring: 2 usage, 3 not found)."""

from __future__ import annotations

import argparse

from nodeagent.cli.ctl import caller
from nodeagent.cli.ctl.targets import Target
from nodeagent.coord import runs
from nodeagent.coord.pool import PoolStore
from nodeagent.coord.store import JobStore, Snapshot
from nodeagent.errors import NotFoundError, UsageError
from nodeagent.model.job import Command, CommandType
from nodeagent.model.pool import PoolJob
from nodeagent.pool import jobverbs


def one_job(args: argparse.Namespace) -> None:
    """The job given as JOB (positional) or --job: the same one if both.

    Raises:
        UsageError: two different jobs.
    """
    given = getattr(args, "job_pos", None)
    if given is None:
        return
    if args.job is not None and args.job != given:
        raise UsageError(f"two jobs given: --job {args.job} and {given}; give one")
    args.job = given


def require_job(store: JobStore, snapshot: Snapshot) -> None:
    """A job exists when it has a record (readable or not) or a node holds a lease."""
    if snapshot.record is None and snapshot.record_error is None and not snapshot.leases:
        raise NotFoundError(
            f"job {store.keys.job!r} does not exist under key prefix {store.keys.prefix!r}: it "
            "has not formed yet (no job record) and no node holds a lease; check --job, "
            "--key-prefix and --redis, or start its agents first"
        )


def require_node(store: JobStore, snapshot: Snapshot, name: str, more: set[str]) -> None:
    """A node is known when it holds a lease, is named by the job record, or is in `more`."""
    known = {lease.name for lease in snapshot.leases} | more
    record = snapshot.record
    if record is not None:
        known |= set(record.members)
        if record.pending_failure is not None:
            known.add(record.pending_failure.node)
    if name not in known:
        listed = ", ".join(sorted(known)) or "none"
        raise NotFoundError(
            f"node {name!r} is not in job {store.keys.job}: it holds no lease and the job "
            f"record does not name it (known nodes: {listed})"
        )


def not_a_pool_job(target: Target) -> None:
    """`stop` stops a pinned job until `restart`; a submitted job ends or requeues instead.

    Raises:
        UsageError: the job was submitted to the pool.
    """
    status = target.pool_store.status(target.job) if target.job else None
    if status is not None and not status.pinned:
        raise UsageError(jobverbs.stop_refusal(target.job or ""))


def send_command(target: Target, kind: CommandType) -> int:
    """A job's restart or stop, once the job is known to exist."""
    store = target.store
    require_job(store, store.snapshot())
    store.send_command(Command(kind, by=caller.by()))
    target.confirm(f"the {kind.value}")
    print(f"job {store.keys.job}: {kind.value} requested")
    return 0


def job_or_tasks(store: PoolStore, job_id: str) -> list[tuple[str, PoolJob]]:
    """The pool job `job_id`, or, when no job has that id, the tasks of the array of that id
    (model/array.py) with their statuses: what `cancel`, `hold`, `release` and `requeue` act on.

    Raises:
        NotFoundError: neither.
    """
    status = store.status(job_id)
    if status is not None:
        return [(job_id, status)]
    found = [(t, s) for t, s in runs.tasks_of(store, job_id).items() if s is not None]
    if not found:
        raise NotFoundError(
            f"no job {job_id!r} in pool {store.keys.pool}, nor an array of that id "
            "(see nodeagentctl jobs)"
        )
    return found
