"""What nodeagentctl hold JOB, release JOB and requeue JOB share (pool.auth none: written here;
with munge signing.py sends them as signed requests). Checked before anything is written
(pool/jobverbs.py): an unknown job, or one in the wrong state, exits 2 and changes nothing.
"""

from __future__ import annotations

import argparse
from typing import Any

from nodeagent.cli.ctl import argtypes
from nodeagent.coord import holds
from nodeagent.coord.pool import PoolStore
from nodeagent.errors import NotFoundError, UsageError
from nodeagent.model.request import Verb
from nodeagent.pool import jobverbs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_id", metavar="JOB", type=argtypes.name)


def request(args: argparse.Namespace) -> tuple[Verb, dict[str, Any]]:
    return Verb(args.command), {"job": args.job_id}


def run(store: PoolStore, args: argparse.Namespace, by: str) -> int:
    """Raises: UsageError: no such job, or not in a state the verb takes."""
    verb, job_id = args.command, args.job_id
    status = store.status(job_id)
    if status is None:
        raise NotFoundError(f"no job {job_id!r} in pool {store.keys.pool} (see nodeagentctl jobs)")
    held = holds.held_by(store, job_id)
    why = jobverbs.refusal(verb, job_id, status, held)
    if why is not None:
        raise UsageError(why)
    if verb == "hold":
        holds.hold(store, job_id, by)
    elif verb == "release":
        holds.release(store, job_id, by)
    else:
        holds.requeue(store, job_id, by, status.admitted_ms or 0)
    print(jobverbs.done(verb, job_id, by))
    return 0
