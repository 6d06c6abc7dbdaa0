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
import fcntl
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from types import FrameType

from prometheus_client import CollectorRegistry

from nodeagent import __version__, logs
from nodeagent.cli import launch, nodehealth
from nodeagent.cli.jobrun import LISTEN_BLOCK_MS, CurrentJobMetrics, JobRun, NodeParts
from nodeagent.config import EMBEDDED, EX_CONFIG, Config, NodeSettings, read_settings
from nodeagent.coord.client import check_credentials, connect
from nodeagent.coord.embedded import EmbeddedRedis
from nodeagent.coord.keys import PoolKeys
from nodeagent.coord.listener import StreamListener
from nodeagent.coord.pool import PoolStore
from nodeagent.errors import ConfigError
from nodeagent.fencing import Keeper, group_alive, kill_leftovers
from nodeagent.health import build_monitor, start_monitor
from nodeagent.logs import LogContext
from nodeagent.logserve import LogRoute
from nodeagent.metrics import MetricsServer
from nodeagent.nodeloop import NodeLoop
from nodeagent.pool.member import PoolMember
from nodeagent.pool.metrics import PoolCollector
from nodeagent.preflight import NodeCheck, check_node
from nodeagent.sdnotify import Notifier
from nodeagent.signalwatch import SignalWatch
from nodeagent.wakeup import Waker

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
    return parser


def _load(path: str) -> NodeSettings | None:
    try:
        return read_settings(path)
    except ConfigError as exc:
        print(f"nodeagent: invalid configuration: {exc}", file=sys.stderr)
        return None


def run_agent(
    config: NodeSettings, context: LogContext, node: NodeCheck, until_done: bool | None = None
) -> int | None:
    """Run until stopped, or (`until_done`; default: with an embedded Redis, one machine, like
    `torchrun --standalone`) until the job ends: then the job's exit code (nodeagent.outcome);
    None when the agent was stopped first. `node`: what check_node(config, create=True) found.

    Raises:
        ConfigError: the embedded Redis cannot start, or Redis refused the credentials.
    """
    record = _worker_record(config, node)
    if record is not None:
        _held_locks.append(_lock(record))
    _clean_legacy(config, node)
    single = config.redis.url == EMBEDDED if until_done is None else until_done
    if config.redis.url != EMBEDDED or not isinstance(config, Config):
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


def _worker_record(config: NodeSettings, node: NodeCheck) -> Path | None:
    """Where this agent's worker process groups are recorded (fencing.Keeper): one file per
    node and pinned job (two `nodeagent launch`es on one machine share its host name), one per
    node for a pool's agent; None if nowhere (the default state directory cannot be written:
    check_node warned about it)."""
    if node.state_dir is None:
        return None
    owner = config.node.name if config.job is None else f"{config.node.name}.{config.job.id}"
    return node.state_dir / f"{owner}.workers.json"


_held_locks: list[int] = []  # the record locks this process holds, open until it exits


def _lock(record: Path) -> int:
    """Lock `record` (its open lock file, held until closed: the agent keeps its own for its
    life). Each agent kills the groups its record names at start (a previous agent's
    leftovers): a second agent of the same node and job would kill the first's running workers.

    Raises:
        ConfigError: another live agent holds it.
    """
    lock = record.with_name(record.name + ".lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError(
            "node.name",
            f"another nodeagent on this machine runs {record.name.removesuffix('.workers.json')}"
            f" (it holds {lock}); give this one another node.name or job id, or stop that one",
        ) from None
    return fd


def _clean_legacy(config: NodeSettings, node: NodeCheck) -> None:
    """A pinned agent's record was `<node>.workers.json` before it was per job: what an agent
    of an older version left there is killed too, unless a live agent (a pool's, which still
    uses that name) holds it."""
    if node.state_dir is None or config.job is None:
        return
    legacy = node.state_dir / f"{config.node.name}.workers.json"
    if not legacy.exists():
        return
    try:
        fd = _lock(legacy)
    except ConfigError:
        return  # a live pool agent's
    try:
        _clean_leftovers(legacy)
        legacy.unlink(missing_ok=True)
    finally:
        os.close(fd)


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


def _run(
    config: NodeSettings, context: LogContext, record: Path | None, until_done: bool
) -> int | None:
    _clean_leftovers(record)
    keeper = Keeper(record)
    keeper.start()
    try:
        return _run_agent(config, context, keeper, until_done)
    finally:
        keeper.close()


def _run_agent(
    settings: NodeSettings, context: LogContext, keeper: Keeper, until_done: bool
) -> int | None:
    timing = settings.timing
    timeout = max(0.2, min(2.0, timing.lease_ttl / 4))
    client = connect(settings.redis.url, timeout, f"nodeagent-{settings.node.name}")
    check_credentials(client)  # ConfigError (exit 78) when refused; unreachable: retried later
    listen_client = connect(settings.redis.url, LISTEN_BLOCK_MS / 1000 + timeout)
    waker = Waker()
    monitor = build_monitor(settings.health)
    start_monitor(monitor, settings.health)  # ConfigError (exit 78) when gpu: on and no NVML
    monitor.on_change = waker.wake
    current = CurrentJobMetrics()
    registry = CollectorRegistry()
    registry.register(current)
    address: list[str] = []
    parts = NodeParts(
        client,
        listen_client,
        waker,
        monitor,
        keeper,
        context,
        Notifier.from_environ(os.environ),
        lambda: address[0] if address else None,
    )
    if until_done and isinstance(settings, Config):  # one job, then exit (launch, embedded)
        single = JobRun(settings, parts, until_done=True)
        current.registry = single.metrics.registry
        run: JobRun | NodeLoop = single
    else:
        run = _node_loop(settings, parts, current, registry)
    server = None
    if settings.metrics.listen != "off":
        logs_route = LogRoute(settings.log_dir, settings.node.name)  # GET /logs/JOB/RANK
        server = MetricsServer(settings.metrics.listen, registry, run.healthz, logs=logs_route)
        server.start()
        address.append(server.address)
        if isinstance(run, JobRun):
            run.agent.metrics_address = server.address
        logging.getLogger(__name__).info("metrics on http://%s/metrics", server.address)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        run.request_stop()  # sets flags only; the wakeup fd ends the loop's wait

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.set_wakeup_fd(waker.signal_fd, warn_on_full_buffer=False)
    try:
        if isinstance(run, JobRun):
            run.agent.run()
            return run.agent.outcome
        run.run()
        return None
    finally:
        if isinstance(run, JobRun):
            run.close()
        elif run.runner is not None:
            run.runner.close()
        monitor.stop()
        if server is not None:
            server.stop()
        signal.set_wakeup_fd(-1)


def _node_loop(
    settings: NodeSettings,
    parts: NodeParts,
    current: CurrentJobMetrics,
    registry: CollectorRegistry,
) -> NodeLoop:
    """A daemon: this node's pool membership and the job it serves (nodeagent.nodeloop)."""
    keys = PoolKeys(settings.redis.key_prefix, settings.pool.name)
    member = PoolMember(PoolStore(parts.client, keys), settings, time.monotonic)
    registry.register(PoolCollector(member, settings.pool.name))

    def start_job(config: Config) -> JobRun:
        run = JobRun(config, parts)
        current.registry = run.metrics.registry
        return run

    def poked() -> None:  # a submission, a placement: heartbeat now, not at the next beat
        member.poke()
        parts.waker.wake()

    listen = StreamListener(PoolStore(parts.listen_client, keys), (keys.events,), poked)
    return NodeLoop(
        settings,
        member,
        start_job,
        parts.waker,
        time.monotonic,
        parts.metrics_address,
        listener=listen,
        notifier=parts.notifier,
    )


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
    job = config.job
    what = (
        f"job {job.id}, node {config.node.name}, "
        f"{job.min_nodes}-{job.max_nodes} nodes x {job.nproc_per_node}"
        if job is not None
        else f"node {config.node.name} of pool {config.pool.name}, jobs as submitted"
    )
    print(f"{args.path}: OK ({what})")
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
    context = LogContext(config.node.name, config.job.id if config.job else "-")
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
