"""nodeagentctl's verbs: one table, name -> module, in the order `nodeagentctl --help` lists
them. The parser (parser.py), the dispatch and the signed form (nodeagentctl.py) are lookups in
it.

Every verb is a module of this package with the same names (`VerbModule`; verbs of one shape
may share a module that makes an object with these names for each: holding.py):
    HELP                        its line in `nodeagentctl --help`
    add_arguments(parser)       its arguments (and its description, if it has one)
    run(target, args)           do it; the exit code
and a verb that can change the pool also (`PoolVerbModule`)
    request(args, user, job)    its signed form under pool.auth: munge (model/request.py): the
                                request's verb and body, or None only where this command line
                                reads (`queue list`); a change it cannot name (no job given)
                                raises UsageError (signing.py sends it)
Every other verb only reads, and is in READS: under pool.auth: munge a verb that is neither is
refused (`unsigned`), so a verb added without its signed form fails closed, not open to a
direct Redis write.

To add a verb: write its module with these names, and add its row here.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from nodeagent.cli.ctl import (
    alloc,
    cancel,
    cordon,
    drain,
    events,
    health,
    history,
    holding,
    jobs,
    logs,
    nodes,
    queue,
    report,
    restart,
    run,
    scale,
    share,
    show,
    stacks,
    status,
    stop,
    submit,
    token,
    ui,
    uncordon,
)
from nodeagent.cli.ctl.targets import Target
from nodeagent.model.request import Verb


class VerbModule(Protocol):
    """What every verb's module holds (the module docstring)."""

    @property
    def HELP(self) -> str: ...

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, target: Target, args: argparse.Namespace) -> int: ...


@runtime_checkable
class PoolVerbModule(VerbModule, Protocol):
    """A verb that can change the pool: it says its signed form."""

    def request(
        self, args: argparse.Namespace, user: str, job: str | None
    ) -> tuple[Verb, dict[str, Any]] | None: ...


VERBS: Mapping[str, VerbModule] = {
    # a job's own
    "status": status,
    "scale": scale,
    "events": events,
    "restart": restart,
    "stop": stop,
    "cordon": cordon,
    "drain": drain,
    "uncordon": uncordon,
    "health": health,
    "logs": logs,
    "stacks": stacks,
    # the pool's
    "submit": submit,
    "alloc": alloc,
    "run": run,
    "jobs": jobs,
    "nodes": nodes,
    "cancel": cancel,
    "hold": holding.HOLD,
    "release": holding.RELEASE,
    "requeue": holding.REQUEUE,
    "show": show,
    "history": history,
    "report": report,
    "share": share,
    "queue": queue,
    "token": token,
    "ui": ui,
}


# The verbs that never change anything (tests/unit/test_ctl_verbs.py checks every other one
# has a signed form, tests/integration/test_ctl_fail_closed.py that these write nothing).
READS = frozenset(
    {
        "status",
        "events",
        "health",
        "logs",
        "stacks",
        "run",  # writes nothing to the pool: each agent takes its own signed request
        "jobs",
        "nodes",
        "show",
        "history",
        "report",
        "share",
    }
)


def unsigned(name: str) -> str | None:
    """Why verb `name` cannot run under pool.auth: munge, where every change is a signed request:
    it neither only reads nor has a signed form. None: it may run."""
    if name in READS or isinstance(VERBS[name], PoolVerbModule):
        return None
    return (
        f"{name}: this pool takes only signed requests (pool.auth: munge) and {name} has no "
        "signed form; refused, nothing written"
    )


def signed_form(
    name: str, args: argparse.Namespace, user: str, job: str | None
) -> tuple[Verb, dict[str, Any]] | None:
    """The request the command line of verb `name` makes of the pool; None where it makes none.
    `job`: the job of --job or --config, for a job's own verbs."""
    verb = VERBS[name]
    return verb.request(args, user, job) if isinstance(verb, PoolVerbModule) else None
