"""nodeagentctl cancel JOB: end a pool job (scancel); its workers get the stop grace. Checked
before anything is written: a job that does not exist or has ended exits 2 (3: unknown) and
leaves Redis as it was."""

from __future__ import annotations

import argparse
from typing import Any

from nodeagent.cli.ctl import argtypes, caller
from nodeagent.cli.ctl.targets import Target
from nodeagent.errors import NotFoundError, UsageError
from nodeagent.model.pool import PoolJobState
from nodeagent.model.request import Verb

HELP = "end a job (its workers get the stop grace)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_id", metavar="JOB", type=argtypes.name)


def request(args: argparse.Namespace, user: str, job: str | None) -> tuple[Verb, dict[str, Any]]:
    return Verb.CANCEL, {"job": args.job_id}


def run(target: Target, args: argparse.Namespace) -> int:
    store, job_id, by = target.pool_store, args.job_id, caller.by()
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
