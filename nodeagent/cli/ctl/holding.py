"""nodeagentctl hold JOB, release JOB and requeue JOB (scontrol's): keep a pending job from
being admitted, let it be admitted, or stop a running one and put it back in its place in the
queue. One shape, so one `JobVerb` each, a row of the table like a verb's module (verbs.py).

pool.auth none: written here; with munge signing.py sends them as signed requests. Checked
before anything is written (pool/jobverbs.py): an unknown job exits 3, one in a state the verb
does not take exits 2, and nothing changes.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from nodeagent.cli.ctl import argtypes, caller, checks
from nodeagent.cli.ctl.targets import Target
from nodeagent.coord import holds
from nodeagent.errors import UsageError
from nodeagent.model.request import Verb
from nodeagent.pool import jobverbs


@dataclass(frozen=True)
class JobVerb:
    """hold, release or requeue: the names of a verb's module (verbs.py), and its help."""

    name: str
    HELP: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("job_id", metavar="JOB", type=argtypes.name)

    def request(
        self, args: argparse.Namespace, user: str, job: str | None
    ) -> tuple[Verb, dict[str, Any]]:
        return Verb(self.name), {"job": args.job_id}

    def run(self, target: Target, args: argparse.Namespace) -> int:
        """The job, or each task of the array of that id the verb can be done to now.

        Raises: NotFoundError: no such job; UsageError: not in a state the verb takes."""
        store, job_id, by = target.pool_store, args.job_id, caller.by()
        found = checks.job_or_tasks(store, job_id)
        whys = [
            (task, status, jobverbs.refusal(self.name, task, status, holds.held_by(store, task)))
            for task, status in found
        ]
        if len(found) == 1 and found[0][0] == job_id and whys[0][2] is not None:
            raise UsageError(str(whys[0][2]))
        doable = [(task, status) for task, status, why in whys if why is None]
        if not doable:
            raise UsageError(f"array {job_id}: {self.name} can be done to none of its tasks")
        for task, status in doable:
            if self.name == "hold":
                holds.hold(store, task, by)
            elif self.name == "release":
                holds.release(store, task, by)
            else:
                holds.requeue(store, task, by, status.admitted_ms or 0)
        target.confirm(f"the {self.name}")
        if doable[0][0] == job_id:
            print(jobverbs.done(self.name, job_id, by))
        else:
            print(f"array {job_id}: {self.name} done to {len(doable)} of {len(found)} tasks")
        return 0


HOLD = JobVerb("hold", "keep a pending job from being admitted (until release)")
RELEASE = JobVerb("release", "let a held job be admitted")
REQUEUE = JobVerb(
    "requeue",
    "stop a running job (its workers get the stop grace to checkpoint) and put it back in the "
    "queue, in its place, under its id",
)
