"""`nodeagent`: the per-node daemon (`nodeagent run`), one job with torchrun's flags
(`nodeagent launch`, cli/launch.py) and `nodeagent config check`.

Exit codes: 0 after a clean shutdown, 78 (EX_CONFIG) for a configuration error (systemd's
RestartPreventExitStatus=78 keeps it from restart-looping), 1 for anything unexpected. With an
embedded Redis (one machine) `run` serves its one job and exits with its result, as
`torchrun --standalone` does: 0, or the failing rank's exit code (or 1).
`config check` and `run` check the same things (nodeagent.preflight), so a config that passes
the check does not fail at start-up on this node; `run` also exits 78 when Redis refuses the
credentials.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from types import FrameType

from nodeagent import __version__, logs
from nodeagent.agent import Agent
from nodeagent.cli import launch, nodehealth
from nodeagent.config import EMBEDDED, EX_CONFIG, Config, read_config
from nodeagent.coord.client import check_credentials, connect
from nodeagent.coord.embedded import EmbeddedRedis
from nodeagent.coord.keys import JobKeys
from nodeagent.coord.listener import StreamListener
from nodeagent.coord.store import JobStore
from nodeagent.errors import ConfigError
from nodeagent.fencing import Keeper, group_alive, kill_leftovers
from nodeagent.health import NodeHealth, build_monitor, start_monitor
from nodeagent.logs import LogContext, WorkerEcho
from nodeagent.metrics import AgentMetrics, MetricsServer
from nodeagent.preflight import NodeCheck, check_node
from nodeagent.preload import Spawner
from nodeagent.sdnotify import Notifier
from nodeagent.signalwatch import SignalWatch
from nodeagent.supervisor import Supervisor
from nodeagent.wakeup import Waker

DEFAULT_CONFIG = "/etc/nodeagent/config.yaml"
LISTEN_BLOCK_MS = 5000


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
    return parser


def _load(path: str) -> Config | None:
    try:
        return read_config(path)
    except ConfigError as exc:
        print(f"nodeagent: invalid configuration: {exc}", file=sys.stderr)
        return None


def run_agent(
    config: Config, context: LogContext, node: NodeCheck, until_done: bool | None = None
) -> int | None:
    """Run until stopped, or (`until_done`; default: with an embedded Redis, one machine, like
    `torchrun --standalone`) until the job ends: then the job's exit code (nodeagent.outcome);
    None when the agent was stopped first. `node`: what check_node(config, create=True) found.

    Raises:
        ConfigError: the embedded Redis cannot start, or Redis refused the credentials.
    """
    record = _worker_record(config, node)
    single = config.redis.url == EMBEDDED if until_done is None else until_done
    if config.redis.url != EMBEDDED:
        return _run(config, context, record, single)
    embedded = EmbeddedRedis(config.job.id, base=_runtime_directory())
    embedded.start()
    logging.getLogger(__name__).info("embedded redis-server at %s", embedded.url)
    try:
        embedded_config = replace(config, redis=replace(config.redis, url=embedded.url))
        return _run(embedded_config, context, record, single)
    finally:
        embedded.stop()


def _runtime_directory() -> Path | None:
    """The service's runtime directory, when systemd made one (RuntimeDirectory=)."""
    value = os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
    return Path(value) if value else None


def _worker_record(config: Config, node: NodeCheck) -> Path | None:
    """Where this node's worker process groups are recorded (fencing.Keeper), None if nowhere
    (the default state directory cannot be written: check_node warned about it)."""
    if node.state_dir is None:
        return None
    return node.state_dir / f"{config.node.name}.workers.json"


def _clean_leftovers(record: Path | None) -> None:
    """Kill what a previous agent of this node left running (it died with its keeper)."""
    if record is None:
        return
    killed = kill_leftovers(record)
    if not killed:
        return
    logging.getLogger(__name__).warning(
        "killed worker process groups %s left by a previous agent", killed
    )
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(group_alive(g) for g in killed):
        time.sleep(0.01)


def _run(config: Config, context: LogContext, record: Path | None, until_done: bool) -> int | None:
    _clean_leftovers(record)
    keeper = Keeper(record)
    keeper.start()
    try:
        return _run_agent(config, context, keeper, until_done)
    finally:
        keeper.close()


def _run_agent(config: Config, context: LogContext, keeper: Keeper, until_done: bool) -> int | None:
    timing = config.timing
    timeout = max(0.2, min(2.0, timing.lease_ttl / 4))
    keys = JobKeys(config.redis.key_prefix, config.job.id)
    client = connect(config.redis.url, timeout, f"nodeagent-{config.node.name}")
    check_credentials(client)  # ConfigError (exit 78) when refused; unreachable: retried later
    store = JobStore(client, keys)
    listen_client = connect(config.redis.url, LISTEN_BLOCK_MS / 1000 + timeout)
    waker = Waker()
    supervisor = Supervisor(
        echo=WorkerEcho(config.logging.format, context),
        wake=waker.wake,
        spawner=Spawner(config.job.preload, config.job.user),
    )
    monitor = build_monitor(config.health)
    start_monitor(monitor, config.health)  # ConfigError (exit 78) when gpu: on and no NVML
    monitor.on_change = waker.wake
    health = NodeHealth(config, monitor)
    metrics = AgentMetrics(config.job.id, __version__)
    metrics.watch_gpus(monitor.snapshot, monitor.verdicts, monitor.xid_counts)
    agent = Agent(
        config,
        store,
        supervisor,
        waker,
        base_env=dict(os.environ),
        health=health,
        metrics=metrics,
        log_context=context,
        notifier=Notifier.from_environ(os.environ),
        keeper=keeper,
        until_done=until_done,
    )
    server = None
    if config.metrics.listen != "off":
        server = MetricsServer(config.metrics.listen, metrics.registry, agent.healthz)
        server.start()
        agent.metrics_address = server.address
        logging.getLogger(__name__).info("metrics on http://%s/metrics", server.address)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        agent.request_stop()  # sets flags only; the wakeup fd ends the loop's wait

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.set_wakeup_fd(waker.signal_fd, warn_on_full_buffer=False)
    listener = StreamListener(JobStore(listen_client, keys), waker.wake, LISTEN_BLOCK_MS)
    listener.start()
    try:
        agent.run()
    finally:
        supervisor.close()
        listener.stop()
        monitor.stop()
        if server is not None:
            server.stop()
        signal.set_wakeup_fd(-1)
    return agent.outcome


def _check(config: Config, *, create: bool) -> NodeCheck | None:
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
    print(
        f"{args.path}: OK (job {config.job.id}, node {config.node.name}, "
        f"{config.job.min_nodes}-{config.job.max_nodes} nodes x {config.job.nproc_per_node})"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["launch"]:  # torchrun's flags and the script's own: parsed there
        return launch.main(argv[1:])
    args = _parser().parse_args(argv)
    if args.command == "config":
        return _config_check(args)
    if args.command == "health":
        return nodehealth.run(args, DEFAULT_CONFIG)
    config = _load(args.config)
    if config is None:
        return EX_CONFIG
    context = LogContext(config.node.name, config.job.id)
    logs.configure(config.logging.format, args.log_level or config.logging.level, context)
    node = _check(config, create=True)  # before anything starts, as `config check` does
    if node is None:
        return EX_CONFIG
    for warning in node.warnings:
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
