"""nodeagentctl hold JOB, release JOB, requeue JOB (pool.auth none: written here; with munge
cli/ctlsigned.py sends them as signed requests). Checked before anything is written
(pool/jobverbs.py): an unknown job, or one in the wrong state, exits 2 and changes nothing.
"""

from __future__ import annotations

import argparse
from typing import Any

from nodeagent.cli import ctlargs
from nodeagent.coord import holds
from nodeagent.coord.pool import PoolStore
from nodeagent.errors import NotFoundError, UsageError
from nodeagent.pool import jobverbs

COMMANDS = frozenset(jobverbs.VERBS)
HELP = {
    "hold": "keep a pending job from being admitted (until release)",
    "release": "let a held job be admitted",
    "requeue": "stop a running job (its workers get the stop grace to checkpoint) and put it "
    "back in the queue, in its place, under its id",
}


def add_parsers(commands: Any) -> None:
    for verb in jobverbs.VERBS:
        parser = commands.add_parser(verb, help=HELP[verb])
        parser.add_argument("job_id", metavar="JOB", type=ctlargs.name)


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
