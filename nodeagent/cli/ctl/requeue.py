"""nodeagentctl requeue JOB: stop a running job (its workers get the stop grace to
checkpoint) and put it back in the queue, in its place, under its id (scontrol requeue); what
hold, release and requeue share is in holding.py."""

from __future__ import annotations

import argparse
from typing import Any

from nodeagent.cli.ctl import caller, holding
from nodeagent.cli.ctl.targets import Target
from nodeagent.model.request import Verb

HELP = (
    "stop a running job (its workers get the stop grace to checkpoint) and put it "
    "back in the queue, in its place, under its id"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    holding.add_arguments(parser)


def request(args: argparse.Namespace, user: str, job: str | None) -> tuple[Verb, dict[str, Any]]:
    return holding.request(args)


def run(target: Target, args: argparse.Namespace) -> int:
    return holding.run(target.pool_store, args, caller.by())
