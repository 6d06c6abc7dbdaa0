"""`run_agent`: build the node's parts from its settings and run until stopped (or, for one job,
until it ends), as `nodeagent run` and `nodeagent launch` do.

The Redis clients, the GPU monitor, the fence keeper, the metrics server and the signal handlers
are the node's; the job's agent (runtime/jobrun.py) or the pool node's loop (runtime/nodeloop.py)
runs inside them.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import replace
from pathlib import Path
from types import FrameType

from prometheus_client import CollectorRegistry

from nodeagent import __version__
from nodeagent.accounting.databases import open_ledger
from nodeagent.config.database import Database, default_database
from nodeagent.config.keyfile import read_password, read_token_key
from nodeagent.config.settings import EMBEDDED, Config, NodeSettings
from nodeagent.coord.client import Redis, check_credentials, connect
from nodeagent.coord.embedded import EmbeddedRedis
from nodeagent.coord.keys import PoolKeys
from nodeagent.coord.listener import StreamListener
from nodeagent.coord.pool import PoolStore
from nodeagent.coord.tokens import TokenStore
from nodeagent.gpu.health import build_monitor, start_monitor, verdicts_only
from nodeagent.gpu.inventory import offered
from nodeagent.model import resources
from nodeagent.model.spec import JobSpec
from nodeagent.pool.authority import Authority, pool_authority
from nodeagent.pool.ledger import Bookkeeper
from nodeagent.pool.member import PoolMember
from nodeagent.pool.metrics import PoolCollector
from nodeagent.pool.notify import Webhooks
from nodeagent.runtime import isolation, joblimits, tuning
from nodeagent.runtime.jobrun import (
    LISTEN_BLOCK_MS,
    CurrentJobMetrics,
    JobRun,
    NodeParts,
)
from nodeagent.runtime.locks import clean_leftovers, clean_legacy, hold, worker_record
from nodeagent.runtime.logins import LoginServer
from nodeagent.runtime.nodeloop import NodeLoop
from nodeagent.runtime.preflight import NodeCheck
from nodeagent.runtime.remote import RunHandoff
from nodeagent.runtime.servechild import ServingProcess
from nodeagent.runtime.wakeup import Waker
from nodeagent.supervisor.fence import Keeper
from nodeagent.supervisor.jobcgroup import Layout
from nodeagent.telemetry.httpd import Handoffs, SlowRoutes
from nodeagent.telemetry.loginwire import LOGIN_SOCKET
from nodeagent.telemetry.logs import LogContext
from nodeagent.telemetry.logserve import LogRoute
from nodeagent.telemetry.metrics import MetricsServer, node_metrics
from nodeagent.telemetry.sdnotify import Notifier
from nodeagent.telemetry.stacks import PREFIX, JobHere, StacksRoute


def run_agent(
    config: NodeSettings, context: LogContext, node: NodeCheck, until_done: bool | None = None
) -> int | None:
    """Run until stopped, or (`until_done`; default: with an embedded Redis, one machine, like
    `torchrun --standalone`) until the job ends: then the job's exit code (nodeagent.job.outcome);
    None when the agent was stopped first. `node`: what check_node(config, create=True) found.

    Raises:
        ConfigError: the embedded Redis cannot start, or Redis refused the credentials.
    """
    record = worker_record(config, node)
    if record is not None:
        hold(record)
    clean_legacy(config, node)
    single = config.redis.url == EMBEDDED if until_done is None else until_done
    logins = _login_socket(node.state_dir, single)
    account = config.pool.accounting.database
    database = (
        None if single else default_database(account, node.state_dir, "pool.accounting.database")
    )
    if config.redis.url != EMBEDDED or config.job is None:
        return _run(config, context, record, single, database, logins)
    embedded = EmbeddedRedis(config.job.id, base=_runtime_directory())
    embedded.start()
    logging.getLogger(__name__).info("embedded redis-server at %s", embedded.url)
    try:
        embedded_config = replace(config, redis=replace(config.redis, url=embedded.url))
        return _run(embedded_config, context, record, single, database, logins)
    finally:
        embedded.stop()


def _runtime_directory() -> Path | None:
    """The service's runtime directory, when systemd made one (RuntimeDirectory=)."""
    value = os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
    return Path(value) if value else None


def _login_socket(state_dir: Path | None, until_done: bool) -> Path | None:
    """Where sshd's PAM check asks this agent (runtime/logins.py): in the service's runtime
    directory, else its state directory; None where no login is taken into a job (`nodeagent
    launch`, an agent that is not root)."""
    if until_done or os.geteuid() != 0:
        return None
    directory = _runtime_directory() or state_dir
    return directory / LOGIN_SOCKET if directory is not None else None


def _run(
    config: NodeSettings,
    context: LogContext,
    record: Path | None,
    until_done: bool,
    database: Database | None,
    logins: Path | None,
) -> int | None:
    clean_leftovers(record)
    cgroups = isolation.node_cgroups(config)  # after the leftovers: their cgroups can go
    isolation.node_space(config)
    keeper = Keeper(record)
    keeper.start()
    try:
        return _run_agent(config, context, keeper, until_done, database, cgroups, logins)
    finally:
        keeper.close()


def _run_agent(
    settings: NodeSettings,
    context: LogContext,
    keeper: Keeper,
    until_done: bool,
    database: Database | None,
    cgroups: Layout | None,
    logins: Path | None,
) -> int | None:
    tuning.tune()
    timeout = settings.timing.redis_timeout
    client = connect(settings.redis.url, timeout, f"nodeagent-{settings.node.name}")
    check_credentials(client)  # ConfigError (exit 78) when refused; unreachable: retried later
    listen_client = connect(settings.redis.url, LISTEN_BLOCK_MS / 1000 + timeout)
    waker = Waker()
    monitor = build_monitor(settings.health)
    start_monitor(monitor, settings.health)  # ConfigError (exit 78) when gpu: on and no NVML
    pinned = settings.job
    if cgroups is not None and pinned is not None and settings.isolation.on:
        room = joblimits.capacity(cgroups, monitor)  # ConfigError (exit 78): more than it has
        joblimits.job_limits(settings.isolation, settings.running(pinned), room, None)
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
        cgroups,
    )
    authority = None if until_done else pool_authority(settings.pool)  # ConfigError: exit 78
    if authority is not None and authority.token_key is not None:  # tokens' logs: not revoked
        keys = PoolKeys(settings.redis.key_prefix, settings.pool.name)
        authority = replace(authority, token_live=TokenStore(parts.client, keys).live)
    booking = _bookkeeper(settings, parts.client, database)  # ConfigError: exit 78
    loop = _node_loop(settings, parts, current, registry, until_done, authority, booking)

    def serving() -> str:
        """The job the node's GPU series are labelled with: the one it serves, if only one
        (a node jobs share: "", as an idle node's; each job's own series carry its job_id)."""
        runners = list(loop.runners)
        return runners[0] if len(runners) == 1 else ""

    node_metrics(
        registry,
        __version__,
        serving,
        monitor.snapshot,
        monitor.verdicts,
        monitor.xid_counts,
        current.users,
        loop.gpu_holders,
    )
    server = None
    if settings.metrics.listen != "off":
        # GET /logs/JOB/RANK: with pool.auth munge, for the job's user and operators only
        logs_route = LogRoute(settings.log_dir, settings.node.name, authority)

        def job_run(job_id: str) -> JobRun | None:
            runner = loop.runners.get(job_id)
            return runner if isinstance(runner, JobRun) else None

        def job_here(job_id: str) -> JobHere | None:
            run = job_run(job_id)
            return run.here() if run is not None else None

        # GET /stacks/JOB and POST /run/JOB: in threads of their own, for the job's user
        stacks = StacksRoute(settings.node.name, job_here, authority)
        handoffs = Handoffs(
            SlowRoutes({PREFIX: stacks}), RunHandoff(settings.node.name, job_run, authority)
        )
        server = MetricsServer(
            settings.metrics.listen, registry, loop.healthz, logs=logs_route, handoff=handoffs
        )
        server.start()
        address.append(server.address)
        logging.getLogger(__name__).info("metrics on http://%s/metrics", server.address)

    login_server = _login_server(logins, settings.node.name, loop)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        loop.request_stop()  # sets flags only; the wakeup fd ends the loop's wait

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.set_wakeup_fd(waker.signal_fd, warn_on_full_buffer=False)
    try:
        return loop.run()
    finally:
        if login_server is not None:
            login_server.stop()
        for runner in loop.runners.values():
            runner.close()
        monitor.stop()
        if server is not None:
            server.stop()
        signal.set_wakeup_fd(-1)


def _login_server(path: Path | None, node: str, loop: NodeLoop) -> LoginServer | None:
    """The login socket at `path`, started (None: none, or it cannot listen: said)."""
    if path is None:
        return None

    def jobs() -> list[JobRun]:  # in the order they started: the newest last
        return [r for r in list(loop.runners.values()) if isinstance(r, JobRun)]

    server = LoginServer(path, node, jobs)
    try:
        server.start()
    except OSError as exc:
        logging.getLogger(__name__).warning("no ssh login is let in: %s: %s", path, exc)
        return None
    return server


def _node_loop(
    settings: NodeSettings,
    parts: NodeParts,
    current: CurrentJobMetrics,
    registry: CollectorRegistry,
    until_done: bool,
    authority: Authority | None,
    booking: Bookkeeper | None,
) -> NodeLoop:
    """The node's loop (nodeagent.runtime.nodeloop): a pool member serving what it is placed on
    or pinned to; `until_done` (`nodeagent launch`, an embedded Redis), no pool: the config's job
    once, then its exit code."""

    def start_job(config: Config, grant: tuple[str, ...] | None) -> JobRun:
        job_id = config.job.id
        run = JobRun(config, parts, until_done, grant, on_close=lambda: current.drop(job_id))
        user = config.job.user.name if config.job.user is not None else ""
        current.serve(config.job.id, run.metrics.registry, user)
        return run

    if until_done:
        return NodeLoop(
            settings, None, start_job, parts.waker, time.monotonic, notifier=parts.notifier
        )
    keys = PoolKeys(settings.redis.key_prefix, settings.pool.name)
    store = PoolStore(parts.client, keys)
    notify = settings.pool.notify
    told = (
        Webhooks(store, notify, read_token_key(notify.key_file, "pool.notify.key_file"))
        if notify.endpoints
        else None
    )
    server = None
    if authority is not None:
        signed = authority

        def stored(spec: JobSpec, raw: str) -> None:  # by the serving process (servechild.py)
            store.made(spec, raw)
            signed.signed(spec)

        server = ServingProcess(settings, stored)
    member = PoolMember(
        store,
        settings,
        time.monotonic,
        authority,
        notifier=told,
        bookkeeper=booking,
        server=server,
    )
    registry.register(PoolCollector(member, settings.pool.name))

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
        inventory=lambda: offered(parts.monitor.snapshot(), parts.monitor.verdicts()),
        offer=lambda: resources.offer(
            joblimits.capacity(parts.cgroups, parts.monitor), settings.isolation
        ),
        gpu=lambda: verdicts_only(parts.monitor),
    )


def _bookkeeper(
    settings: NodeSettings, client: Redis, database: Database | None
) -> Bookkeeper | None:
    """What takes the pool's ended jobs into pool.accounting's database (None: kept nowhere).

    Raises:
        ConfigError: its password file cannot be read, or PostgreSQL without psycopg.
    """
    if database is None:
        return None
    account = settings.pool.accounting
    password = None
    if account.password_file:
        password = read_password(account.password_file, "pool.accounting.password_file")
    keys = PoolKeys(settings.redis.key_prefix, settings.pool.name)
    ledger = open_ledger(database, password)
    return Bookkeeper(PoolStore(client, keys), ledger, time.monotonic)
