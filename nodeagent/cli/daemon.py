"""`nodeagent`: the per-node daemon (`nodeagent run`) and `nodeagent config check`.

Exit codes: 0 after a clean shutdown, 78 (EX_CONFIG) for a configuration error (systemd's
RestartPreventExitStatus=78 keeps it from restart-looping), 1 for anything unexpected.
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
from nodeagent.config import DEFAULT_STATE_DIR, EMBEDDED, EX_CONFIG, Config, read_config
from nodeagent.coord.client import connect
from nodeagent.coord.embedded import EmbeddedRedis
from nodeagent.coord.keys import JobKeys
from nodeagent.coord.listener import StreamListener
from nodeagent.coord.store import JobStore
from nodeagent.errors import ConfigError
from nodeagent.fencing import Keeper, group_alive, kill_leftovers
from nodeagent.health import NodeHealth, build_monitor, start_monitor
from nodeagent.logs import LogContext, WorkerEcho
from nodeagent.metrics import AgentMetrics, MetricsServer
from nodeagent.preload import Spawner
from nodeagent.sdnotify import Notifier
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
    config = commands.add_parser("config", help="configuration tools")
    config_commands = config.add_subparsers(dest="config_command", required=True)
    check = config_commands.add_parser("check", help="validate a config file; exit 0 or 78")
    check.add_argument("path")
    return parser


def _load(path: str) -> Config | None:
    try:
        return read_config(path)
    except ConfigError as exc:
        print(f"nodeagent: invalid configuration: {exc}", file=sys.stderr)
        return None


def run_agent(config: Config, context: LogContext) -> int:
    if config.redis.url != EMBEDDED:
        return _run(config, context)
    embedded = EmbeddedRedis(config.job.id)
    embedded.start()
    logging.getLogger(__name__).info("embedded redis-server at %s", embedded.url)
    try:
        return _run(replace(config, redis=replace(config.redis, url=embedded.url)), context)
    finally:
        embedded.stop()


def _worker_record(config: Config) -> Path | None:
    """Where this node's worker process groups are recorded (fencing.Keeper), None if nowhere.

    Raises:
        ConfigError: naming state_dir, when a state_dir set in the config cannot be written.
    """
    directory = Path(config.state_dir or DEFAULT_STATE_DIR)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        if not os.access(directory, os.W_OK):
            raise PermissionError(f"{directory} is not writable")
    except OSError as exc:
        if config.state_dir is not None:
            raise ConfigError("state_dir", f"cannot use {directory}: {exc}") from exc
        logging.getLogger(__name__).warning(
            "no state directory (%s): a restarted agent cannot find workers a crashed one left; "
            "set state_dir to a writable directory",
            exc,
        )
        return None
    return directory / f"{config.node.name}.workers.json"


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


def _run(config: Config, context: LogContext) -> int:
    record = _worker_record(config)
    _clean_leftovers(record)
    keeper = Keeper(record)
    keeper.start()
    try:
        return _run_agent(config, context, keeper)
    finally:
        keeper.close()


def _run_agent(config: Config, context: LogContext, keeper: Keeper) -> int:
    timing = config.timing
    timeout = max(0.2, min(2.0, timing.lease_ttl / 4))
    keys = JobKeys(config.redis.key_prefix, config.job.id)
    store = JobStore(connect(config.redis.url, timeout, f"nodeagent-{config.node.name}"), keys)
    listen_client = connect(config.redis.url, LISTEN_BLOCK_MS / 1000 + timeout)
    waker = Waker()
    supervisor = Supervisor(
        echo=WorkerEcho(config.logging.format, context),
        wake=waker.wake,
        spawner=Spawner(config.job.preload),
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
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "config":
        config = _load(args.path)
        if config is None:
            return EX_CONFIG
        print(
            f"{args.path}: OK (job {config.job.id}, node {config.node.name}, "
            f"{config.job.min_nodes}-{config.job.max_nodes} nodes x {config.job.nproc_per_node})"
        )
        return 0
    config = _load(args.config)
    if config is None:
        return EX_CONFIG
    context = LogContext(config.node.name, config.job.id)
    logs.configure(config.logging.format, args.log_level or config.logging.level, context)
    try:
        return run_agent(config, context)
    except ConfigError as exc:  # e.g. an embedded Redis that cannot start
        print(f"nodeagent: {exc}", file=sys.stderr)
        return EX_CONFIG


if __name__ == "__main__":
    raise SystemExit(main())
