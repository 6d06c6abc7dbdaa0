"""nodeagentctl stop [JOB]: stop a pinned job's workers everywhere until `restart`; a job
submitted to the pool is cancelled or requeued instead (refused here, exit 2)."""

from __future__ import annotations

import argparse
from typing import Any

from nodeagent.cli.ctl import argtypes, checks, targets
from nodeagent.cli.ctl.targets import Target
from nodeagent.model.job import CommandType
from nodeagent.model.request import Verb

HELP = "stop a pinned job's workers everywhere (`restart` resumes); a pool job: cancel or requeue"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    argtypes.job_argument(parser)


def request(args: argparse.Namespace, user: str, job: str | None) -> tuple[Verb, dict[str, Any]]:
    return Verb.COMMAND, {"job": targets.required(job), "kind": "stop"}


def run(target: Target, args: argparse.Namespace) -> int:
    checks.not_a_pool_job(target)
    return checks.send_command(target, CommandType.STOP)
