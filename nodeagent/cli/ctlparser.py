"""nodeagentctl's command line: its global options and every verb's arguments (each module of a
verb adds its own: ctllogs, ctlpool, ctlsubmit, ctljobverbs, ctlhistory, ctlqueue)."""

from __future__ import annotations

import argparse

from nodeagent import __version__
from nodeagent.cli import ctlargs, ctlhistory, ctljobverbs, ctllogs, ctlpool, ctlqueue, ctltarget
from nodeagent.supervisor.munge import DEFAULT_SOCKET


def parser(description: str = "nodeagentctl") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nodeagentctl", description=description)
    parser.add_argument("--version", action="version", version=f"nodeagentctl {__version__}")
    where = parser.add_argument_group("which job (either --config, or --redis and --job)")
    where.add_argument("--config", help="an agent's config file")
    where.add_argument(
        "--redis",
        help="Redis URL, e.g. redis://10.0.0.2:6379/0 (default: --config's, else "
        f"${ctltarget.URL_ENV})",
    )
    where.add_argument(
        "--redis-password-file",
        metavar="PATH",
        help=f"read the Redis password from this file (or set {ctlargs.PASSWORD_ENV})",
    )
    where.add_argument("--job", type=ctlargs.name, help="job id")
    where.add_argument(
        "--key-prefix", type=ctlargs.name, default=None, help="Redis key prefix (default nodeagent)"
    )
    where.add_argument(
        "--pool", type=ctlargs.name, help="pool name (default: pool.name of --config, or default)"
    )
    where.add_argument(
        "--munge-socket",
        metavar="PATH",
        help="munged's socket, for a pool with pool.auth: munge (default: pool.munge_socket of "
        f"--config, or {DEFAULT_SOCKET})",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    status = commands.add_parser("status", help="show the job and its nodes")
    job_argument(status)
    status.add_argument("--json", action="store_true", help="machine-readable output")
    scale = commands.add_parser(
        "scale", help="change a job's target number of nodes: scale [JOB] N, +N or -N"
    )
    scale.add_argument(
        "what",
        nargs="+",
        metavar="[JOB] N",
        help="the job (default --job) and its new target within [min_nodes, max_nodes], or "
        "+N / -N relative to the current one",
    )
    scale.add_argument("--wait", action="store_true", help="wait until the job runs at that size")
    timeout(scale)
    scale.add_argument("--rollback", action="store_true", help="on timeout restore the old target")
    events = commands.add_parser("events", help="show the job's event log")
    job_argument(events)
    events.add_argument("--follow", "-f", action="store_true", help="keep printing new events")
    events.add_argument("--json", action="store_true", help="one JSON object per line")
    events.add_argument(
        "--last", type=ctlargs.count, default=50, help="how many past events (default 50)"
    )
    events.add_argument(
        "--pool",
        dest="pool_stream",
        action="store_true",
        help="the pool's events (who submitted, cancelled, drained what) instead of a job's",
    )
    restart = commands.add_parser(
        "restart", help="force a new generation (also restarts a finished job)"
    )
    job_argument(restart)
    stop = commands.add_parser(
        "stop",
        help="stop a pinned job's workers everywhere (`restart` resumes); a pool job: cancel "
        "or requeue",
    )
    job_argument(stop)
    cordon = commands.add_parser("cordon", help="keep a node out of the next generations")
    cordon.add_argument("node", type=ctlargs.name)
    cordon.add_argument("--reason", default="cordoned by an operator")
    drain = commands.add_parser(
        "drain", help="cordon a node and take it out of the job now (its workers checkpoint)"
    )
    drain.add_argument("node", type=ctlargs.name)
    drain.add_argument("--reason", default="drained by an operator")
    drain.add_argument("--wait", action="store_true", help="wait until its workers are stopped")
    timeout(drain)
    uncordon = commands.add_parser("uncordon", help="let a node take part again")
    uncordon.add_argument("node", type=ctlargs.name)
    health = commands.add_parser("health", help="a node's GPU verdicts (default: this node)")
    health.add_argument(
        "--node", type=ctlargs.name, help="node name (default: node.name of --config)"
    )
    health.add_argument("--json", action="store_true")
    ctllogs.add_parser(commands)
    ctlpool.add_parsers(commands)
    ctljobverbs.add_parsers(commands)
    ctlhistory.add_parsers(commands)
    ctlqueue.add_parser(commands)
    return parser


def job_argument(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "job_pos", nargs="?", metavar="JOB", type=ctlargs.name, help="the job (or --job JOB)"
    )


def timeout(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--timeout",
        type=ctlargs.duration,
        default="10m",
        help="how long --wait waits, e.g. 30s or 10m (default 10m)",
    )
