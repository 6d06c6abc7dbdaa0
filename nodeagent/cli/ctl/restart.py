"""nodeagentctl restart [JOB]: force a new generation (also restarts a finished job)."""

from __future__ import annotations

import argparse
from typing import Any

from nodeagent.cli.ctl import argtypes, checks, targets
from nodeagent.cli.ctl.targets import Target
from nodeagent.model.job import CommandType
from nodeagent.model.request import Verb

HELP = "force a new generation (also restarts a finished job)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    argtypes.job_argument(parser)


def request(args: argparse.Namespace, user: str, job: str | None) -> tuple[Verb, dict[str, Any]]:
    return Verb.COMMAND, {"job": targets.required(job), "kind": "restart"}


def run(target: Target, args: argparse.Namespace) -> int:
    return checks.send_command(target, CommandType.RESTART)
