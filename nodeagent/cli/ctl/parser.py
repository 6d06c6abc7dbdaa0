"""nodeagentctl's command line: its global options and every verb's arguments (each module of a
verb adds its own: ctllogs, ctlpool, ctlsubmit, ctljobverbs, ctlhistory, ctlqueue)."""

from __future__ import annotations

import argparse

from nodeagent import __version__
from nodeagent.cli.ctl import argtypes, targets
from nodeagent.cli.ctl.verbs import VERBS
from nodeagent.supervisor.munge import DEFAULT_SOCKET


def parser(description: str = "nodeagentctl") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nodeagentctl", description=description)
    parser.add_argument("--version", action="version", version=f"nodeagentctl {__version__}")
    where = parser.add_argument_group("which job (either --config, or --redis and --job)")
    where.add_argument("--config", help="an agent's config file")
    where.add_argument(
        "--redis",
        help="Redis URL, e.g. redis://10.0.0.2:6379/0 (default: --config's, else "
        f"${targets.URL_ENV})",
    )
    where.add_argument(
        "--redis-password-file",
        metavar="PATH",
        help=f"read the Redis password from this file (or set {argtypes.PASSWORD_ENV})",
    )
    where.add_argument("--job", type=argtypes.name, help="job id")
    where.add_argument(
        "--key-prefix",
        type=argtypes.name,
        default=None,
        help="Redis key prefix (default nodeagent)",
    )
    where.add_argument(
        "--pool", type=argtypes.name, help="pool name (default: pool.name of --config, or default)"
    )
    where.add_argument(
        "--munge-socket",
        metavar="PATH",
        help="munged's socket, for a pool with pool.auth: munge (default: pool.munge_socket of "
        f"--config, or {DEFAULT_SOCKET})",
    )
    parser.add_argument(
        "--request-id",
        metavar="ID",
        type=argtypes.request_id,
        help="the id of this change (default: a new one): the same command run again with the "
        "id an earlier run printed is that change, never done twice",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for name, verb in VERBS.items():
        verb.add_arguments(commands.add_parser(name, help=verb.HELP))
    return parser
