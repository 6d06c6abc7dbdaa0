"""nodeagentctl cancel JOB: end a pool job (scancel); its workers get the stop grace. Checked
before anything is written: a job that does not exist or has ended exits 2 (3: unknown) and
leaves Redis as it was."""

from __future__ import annotations

import argparse
from typing import Any

from nodeagent.cli.ctl import argtypes, caller, checks
from nodeagent.cli.ctl.targets import Target
from nodeagent.errors import UsageError
from nodeagent.model.request import Verb

HELP = "end a job (its workers get the stop grace)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_id", metavar="JOB", type=argtypes.name)


def request(args: argparse.Namespace, user: str, job: str | None) -> tuple[Verb, dict[str, Any]]:
    return Verb.CANCEL, {"job": args.job_id}


def run(target: Target, args: argparse.Namespace) -> int:
    """The job, or each task of the array of that id that has not ended."""
    store, job_id, by = target.pool_store, args.job_id, caller.by()
    found = checks.job_or_tasks(store, job_id)
    array = len(found) > 1 or found[0][0] != job_id
    if array:
        found = [(t, s) for t, s in found if not s.state.ended]
    for task, status in found:
        if status.state.ended:
            raise UsageError(f"job {task} has ended already ({status.state.value})")
        if status.pinned:
            raise UsageError(
                f"job {task} comes from its nodes' job: sections; stop it with "
                f"`nodeagentctl --job {task} stop`"
            )
    if not found:
        raise UsageError(f"array {job_id}: every task has ended already")
    for task, _ in found:
        store.cancel(task, by)
    target.confirm("the cancel")
    print(f"array {job_id}: cancel requested for {len(found)} tasks" if array
          else f"job {job_id}: cancel requested")  # fmt: skip
    return 0
