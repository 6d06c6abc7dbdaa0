"""`nodeagent`: the per-node daemon (`nodeagent run`), one job with torchrun's flags
(`nodeagent launch`, cli/launch.py) and `nodeagent config check`.

Exit codes: 0 after a clean shutdown, 78 (EX_CONFIG) for a configuration error (systemd's
RestartPreventExitStatus=78 keeps it from restart-looping), 1 for anything unexpected. With an
embedded Redis (one machine) `run` serves its one job and exits with its result, as
`torchrun --standalone` does: 0, or the failing rank's exit code (or 1).
`config check` and `run` check the same things (nodeagent.runtime.preflight), so a config that
passes the check does not fail at start-up on this node; `run` also exits 78 when Redis refuses the
credentials.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from nodeagent import __version__
from nodeagent.cli import api, launch, nodehealth
from nodeagent.config.load import read_settings
from nodeagent.config.settings import EX_CONFIG, NodeSettings
from nodeagent.errors import ConfigError
from nodeagent.pool.authority import pool_authority
from nodeagent.runtime.preflight import NodeCheck, check_node
from nodeagent.runtime.run import run_agent
from nodeagent.runtime.signalwatch import SignalWatch
from nodeagent.telemetry import logs
from nodeagent.telemetry.logs import LogContext

DEFAULT_CONFIG = "/etc/nodeagent/config.yaml"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nodeagent", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"nodeagent {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the agent in the foreground (what systemd runs)")
    run.add_argument(
        "--config", default=DEFAULT_CONFIG, help=f"config file (default {DEFAULT_CONFIG})"
    )
    run.add_argument(
        "--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="overrides logging.level"
    )
    commands.add_parser(
        "launch",
        add_help=False,
        help="one job in the foreground with torchrun's flags; exits with its result "
        "(`nodeagent launch --help`)",
    )
    config = commands.add_parser("config", help="configuration tools")
    config_commands = config.add_subparsers(dest="config_command", required=True)
    check = config_commands.add_parser(
        "check",
        help="validate a config file and this node's part of it (directories, the entrypoint's "
        "program, the metrics address); exit 0 or 78",
    )
    check.add_argument("path")
    check.add_argument(
        "--syntax-only",
        action="store_true",
        help="only the file and its values, not this node (for a config written for others)",
    )
    nodehealth.add_parser(commands, DEFAULT_CONFIG)
    api.add_parser(commands)
    return parser


def _load(path: str) -> NodeSettings | None:
    try:
        return read_settings(path)
    except ConfigError as exc:
        print(f"nodeagent: invalid configuration: {exc}", file=sys.stderr)
        return None


def _check(config: NodeSettings, *, create: bool) -> NodeCheck | None:
    try:
        return check_node(config, os.environ, create=create)
    except ConfigError as exc:
        print(f"nodeagent: invalid configuration: {exc}", file=sys.stderr)
        return None


def _config_check(args: argparse.Namespace) -> int:
    config = _load(args.path)
    if config is None:
        return EX_CONFIG
    if not args.syntax_only:
        node = _check(config, create=False)
        if node is None:
            return EX_CONFIG
        for warning in node.warnings:
            print(f"nodeagent: warning: {warning}", file=sys.stderr)
    for warning in auth_warnings(config, probe=not args.syntax_only):
        print(f"nodeagent: warning: {warning}", file=sys.stderr)
    job = config.job
    what = (
        f"job {job.id}, node {config.node.name}, "
        f"{job.min_nodes}-{job.max_nodes} nodes x {job.nproc_per_node}"
        if job is not None
        else f"node {config.node.name} of pool {config.pool.name}, jobs as submitted"
    )
    print(f"{args.path}: OK ({what}; pool.auth {config.pool.auth})")
    return 0


def auth_warnings(config: NodeSettings, probe: bool) -> list[str]:
    """What `config check` says of pool.auth: none out loud (a pool node), and of a munged
    this node cannot reach (`run` exits 78 then)."""
    pool = config.pool
    if pool.auth == "none":
        if config.job is not None:
            return []  # a pinned node: its job is its config's own, as before
        return [
            f"pool.auth: none: whoever can write pool {pool.name}'s Redis keys submits jobs as "
            "any user this node allows, cancels every job and drains every node; set "
            'pool.auth: munge for a shared pool (docs/pool.md, "Who is who in the pool")'
        ]
    if not probe:
        return []
    try:
        pool_authority(pool)
    except ConfigError as exc:
        return [f"{exc}; `nodeagent run` exits 78 until munged answers"]
    return []


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["launch"]:  # torchrun's flags and the script's own: parsed there
        return launch.main(argv[1:])
    args = _parser().parse_args(argv)
    if args.command == "config":
        return _config_check(args)
    if args.command == "health":
        return nodehealth.run(args, DEFAULT_CONFIG)
    if args.command == "api":
        return api.run(args)
    config = _load(args.config)
    if config is None:
        return EX_CONFIG
    context = LogContext(config.node.name, config.job.id if config.job else "-")
    logs.configure(config.logging.format, args.log_level or config.logging.level, context)
    node = _check(config, create=True)  # before anything starts, as `config check` does
    if node is None:
        return EX_CONFIG
    for warning in [*node.warnings, *auth_warnings(config, probe=False)]:
        logging.getLogger(__name__).warning("%s", warning)
    watch = SignalWatch()  # SIGHUP: logged and ignored; SIGUSR1: the agent's stacks
    watch.install()
    try:
        code = run_agent(config, context, node)
        return 0 if code is None else code  # stopped: a clean shutdown
    except ConfigError as exc:  # an embedded Redis that cannot start, refused credentials
        print(f"nodeagent: {exc}", file=sys.stderr)
        return EX_CONFIG
    finally:
        watch.close()


if __name__ == "__main__":
    raise SystemExit(main())
