"""nodeagentctl hold JOB: keep a pending job from being admitted until `release` (scontrol
hold); what hold, release and requeue share is in holding.py."""

from __future__ import annotations

import argparse
from typing import Any

from nodeagent.cli.ctl import caller, holding
from nodeagent.cli.ctl.targets import Target
from nodeagent.model.request import Verb

HELP = "keep a pending job from being admitted (until release)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    holding.add_arguments(parser)


def request(args: argparse.Namespace, user: str, job: str | None) -> tuple[Verb, dict[str, Any]]:
    return holding.request(args)


def run(target: Target, args: argparse.Namespace) -> int:
    return holding.run(target.pool_store, args, caller.by())
