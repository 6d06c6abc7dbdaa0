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

from nodeagent.cli.ctl import argtypes, caller
from nodeagent.cli.ctl.targets import Target
from nodeagent.coord import holds
from nodeagent.errors import NotFoundError, UsageError
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
        """Raises: NotFoundError: no such job; UsageError: not in a state the verb takes."""
        store, job_id, by = target.pool_store, args.job_id, caller.by()
        status = store.status(job_id)
        if status is None:
            raise NotFoundError(
                f"no job {job_id!r} in pool {store.keys.pool} (see nodeagentctl jobs)"
            )
        why = jobverbs.refusal(self.name, job_id, status, holds.held_by(store, job_id))
        if why is not None:
            raise UsageError(why)
        if self.name == "hold":
            holds.hold(store, job_id, by)
        elif self.name == "release":
            holds.release(store, job_id, by)
        else:
            holds.requeue(store, job_id, by, status.admitted_ms or 0)
        print(jobverbs.done(self.name, job_id, by))
        return 0


HOLD = JobVerb("hold", "keep a pending job from being admitted (until release)")
RELEASE = JobVerb("release", "let a held job be admitted")
REQUEUE = JobVerb(
    "requeue",
    "stop a running job (its workers get the stop grace to checkpoint) and put it back in the "
    "queue, in its place, under its id",
)
