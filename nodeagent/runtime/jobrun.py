"""Wiring one job's agent on this node: what is the node's (the Redis client, the GPU monitor,
the fence keeper, the wake-ups) is shared; the job's store, supervisor, stream listener and
metrics are its own, made when the node starts serving the job and closed when it leaves.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from nodeagent.checkpoint import persistcopy, space
from nodeagent.checkpoint.keeper import TierKeeper
from nodeagent.checkpoint.peerauth import MungePlane, PlaneAuth, Unauthenticated
from nodeagent.checkpoint.persistcopy import IN_AGENT, AsJobUser
from nodeagent.checkpoint.replicas import Replicas
from nodeagent.checkpoint.transport import Listening
from nodeagent.config.settings import CheckpointConfig, Config, beside_tier
from nodeagent.coord.client import Redis
from nodeagent.coord.keys import JobKeys
from nodeagent.coord.listener import StreamListener
from nodeagent.coord.store import JobStore
from nodeagent.errors import ConfigError
from nodeagent.gpu.health import NodeHealth
from nodeagent.gpu.monitor import GpuMonitor
from nodeagent.job.agent import Agent, AgentParts
from nodeagent.job.peerwatch import PeerWatch
from nodeagent.job.verify import RecordCheck
from nodeagent.model.credential import MungeUnavailable
from nodeagent.model.job import Event
from nodeagent.model.resources import Limits
from nodeagent.runtime import joblimits
from nodeagent.runtime.pulls import Pulled
from nodeagent.runtime.wakeup import Waker
from nodeagent.supervisor.asuser import run_as
from nodeagent.supervisor.command import Command
from nodeagent.supervisor.container import Containers, Podman, Share
from nodeagent.supervisor.fence import Keeper
from nodeagent.supervisor.group import Supervisor
from nodeagent.supervisor.jobcgroup import Layout
from nodeagent.supervisor.libmunge import munge_at
from nodeagent.supervisor.spares import Spawner
from nodeagent.supervisor.worker import py_spy_dump
from nodeagent.telemetry.logs import LogContext, WorkerEcho
from nodeagent.telemetry.metrics import AgentMetrics, with_user
from nodeagent.telemetry.runwire import RunOrder
from nodeagent.telemetry.sdnotify import Notifier
from nodeagent.telemetry.stacks import JobHere, RankHere

log = logging.getLogger(__name__)
LISTEN_BLOCK_MS = 5000


@dataclass(frozen=True)
class NodeParts:
    """What every job this node serves shares."""

    client: Redis
    listen_client: Redis
    waker: Waker
    monitor: GpuMonitor
    keeper: Keeper
    context: LogContext
    notifier: Notifier
    metrics_address: Callable[[], str | None]
    cgroups: Layout | None = None  # where job cgroups go (runtime/isolation.py; None: none)


class CurrentJobMetrics(Collector):
    """The /metrics of the jobs the node serves now (none: nothing), each per-job series
    (those with a job_id) labelled with its job's `user` too, so that an alert can be routed
    to its submitter (config/prometheus/nodeagent-alerts.yml keeps it)."""

    def __init__(self) -> None:
        # job -> its registry and user; replaced whole, never changed: a scrape reads one
        self._serving: dict[str, tuple[CollectorRegistry, str]] = {}

    def serve(self, job: str, registry: CollectorRegistry, user: str) -> None:
        """The job's metrics from now on, `user`: whom it runs as ("": the agent's own)."""
        self._serving = {**self._serving, job: (registry, user)}

    def drop(self, job: str) -> None:
        """The node left the job: its series go."""
        self._serving = {j: served for j, served in self._serving.items() if j != job}

    def users(self) -> dict[str, str]:
        """Whom each job the node serves runs as."""
        return {job: user for job, (_, user) in self._serving.items()}

    def collect(self) -> Iterable[Metric]:
        for registry, user in self._serving.values():
            yield from with_user(registry.collect(), user)


def _tiers(config: Config) -> TierKeeper | None:
    """The job's checkpoint tiers on this node, made for its workers' user (job.checkpoint)."""
    checkpoint = config.job.checkpoint
    if checkpoint is None:
        return None
    most = checkpoint.rank_limit(config.job.nproc_per_node)
    user = config.job.user
    copier = IN_AGENT
    if checkpoint.persist_as_user and user is not None:  # a submitted job's own directory
        copier = AsJobUser(functools.partial(run_as, user, most=persistcopy.REPLY_MAX))
    keeper = TierKeeper(checkpoint, config.node.name, config.job.id, most=most, copier=copier)
    if user is not None and user.switch:
        keeper.prepare(user.uid, user.gid)
    else:
        keeper.prepare(None)
    return keeper


def _replicas(config: Config, landed: Callable[[], None]) -> Replicas | None:
    """The job's replica area on this node (job.checkpoint.replicas), readable by its workers;
    None where the job keeps no copies, or where the plane cannot authenticate its peers.
    `landed`: wakes the loop when a peer's save is whole here (the report goes out at once)."""
    checkpoint = config.job.checkpoint
    if checkpoint is None or not checkpoint.replicas:
        return None
    auth = plane_auth(config)
    if auth is None:
        return None
    listening = Listening(
        config.job.id,
        config.node.name,
        auth,
        config.node.address,
        checkpoint.replica_port,
        checkpoint.rank_limit(config.job.nproc_per_node),
    )
    replicas = Replicas(
        checkpoint,
        config.node.name,
        config.job.id,
        listening,
        per_node=config.job.nproc_per_node,
        landed=landed,
    )
    user = config.job.user
    replicas.prepare(user.gid if user is not None and user.switch else None)
    return replicas


def _peers(config: Config, wake: Callable[[], None]) -> PeerWatch | None:
    """The watch of the job's other members (job/peerwatch.py), unless timing.peer_interval
    is off. It listens on the node's address, as the workers' process groups do."""
    timing = config.timing
    if timing.peer_interval <= 0:
        return None
    return PeerWatch(
        config.node.address, timing.peer_interval, timing.peer_timeout, wake, phi=timing.peer_phi
    )


def plane_auth(config: Config) -> PlaneAuth | None:
    """How this node's checkpoint plane authenticates its peers (checkpoint/peerauth.py):
    MUNGE under pool.auth: munge or job.checkpoint.replication.auth: munge (the default), once
    this host's munged answers; nothing only where the config says `auth: none`. None (and an
    error said once): munge asked for and munged cannot be reached; the job then runs with no
    copies between nodes on this node, never with an open plane."""
    checkpoint = config.job.checkpoint
    assert checkpoint is not None
    if config.pool.auth != "munge" and checkpoint.replica_auth == "none":
        log.warning(
            "checkpoint plane: job.checkpoint.replication.auth: none: any host that reaches "
            "%s may send this node copies and fetch the job's saves (docs/operations.md)",
            config.node.address,
        )
        return Unauthenticated()
    munge = munge_at(config.pool.munge_socket)
    try:
        munge.encode("nodeagent: is munged there")
    except MungeUnavailable as exc:
        log.error(
            "checkpoint plane: no copies between nodes for job %s on this node: peers must "
            "prove they are agents with MUNGE, but %s. Start munged (Debian: apt-get install "
            "munge; every node shares /etc/munge/munge.key) and point pool.munge_socket at its "
            "socket, or set job.checkpoint.replication.auth: none where every host that can "
            "reach node.address is trusted",
            config.job.id,
            exc,
        )
        return None
    return MungePlane(munge, os.geteuid())


def _containers(config: Config, limits: Limits | None) -> Containers | None:
    """A job with `container:`: its workers run in its image (supervisor/container.py), each
    container limited to its part of the job's `limits`."""
    spec = config.job.container
    if spec is None:
        return None
    tiers = config.job.checkpoint
    memory_dir = tiers.memory_dir if tiers is not None else CheckpointConfig.memory_dir
    node, job = config.node.name, config.job.id
    base = Path(memory_dir) / f"{node}.{job}"
    runtime = Podman(config.containers, spec)

    def make_dir(path: Path, mode: int, uid: int, gid: int) -> None:
        """No job's tier is named so (settings.beside_tier); one marked as another job's is
        refused all the same, not taken over (space.make_marked)."""
        try:
            space.make_marked(
                path, "the job's container files", mode, node, job, uid, gid, inherit=False
            )
        except ConfigError as exc:
            raise OSError(str(exc)) from None

    shm, run = Path(beside_tier(str(base), "shm")), Path(beside_tier(str(base), "run"))
    share = Share.of(limits, config.job.nproc_per_node) if limits is not None else None
    return Containers(runtime, node, job, shm, run, config.job.user, make_dir, share)


class JobRun:
    """One job's Agent on this node, and what only it uses."""

    def __init__(
        self,
        config: Config,
        parts: NodeParts,
        until_done: bool = False,
        grant: tuple[str, ...] | None = None,
        on_close: Callable[[], None] = lambda: None,
    ) -> None:
        """`grant`: the GPUs (UUIDs) this node gave the job, when it shares the node (None: the
        whole node's); `on_close`: called once it closed (its metrics go)."""
        self.job_id = config.job.id
        self._user = config.job.user
        self._on_close = on_close
        keys = JobKeys(config.redis.key_prefix, config.job.id)
        # The node's log lines say which job and generation they are of: the one context is
        # this job's while its agent acts (_acting), and its workers' lines have their own.
        self._context = parts.context
        self._generation = 0
        self._workers_context = LogContext(config.node.name, config.job.id)
        self._acting()
        monitor = parts.monitor
        job = config.job
        limits = None  # ConfigError first, before anything is made: the node refuses the job
        room = None
        if parts.cgroups is not None and config.isolation.on:
            room = joblimits.capacity(parts.cgroups, monitor)
            limits = joblimits.job_limits(config.isolation, config, room, grant)
        self.metrics = AgentMetrics(config.job.id)  # its GPUs are the node's (node_metrics)
        needed = job.nproc_per_node * job.gpus_per_worker
        self._health = NodeHealth(
            config.node.name, config.health, needed, monitor, grant, job.gpus_per_worker
        )
        cgroup = joblimits.job_cgroup(config, parts.cgroups, limits)
        devices = joblimits.job_devices(config, cgroup, monitor, self._health)
        space = joblimits.job_space(config, cgroup, limits)
        cpus_of = joblimits.job_cpus(config, monitor, limits, room.cores if room else None)
        spawner = Spawner(
            job.preload, job.user, _containers(config, limits), cgroup, devices, space, cpus_of
        )
        self.supervisor = Supervisor(
            echo=WorkerEcho(config.logging.format, self._workers_context),
            wake=parts.waker.wake,
            spawner=spawner,
            warm_ups=job.warm_ups,
        )
        self.tiers = _tiers(config)
        self.replicas = _replicas(config, parts.waker.wake) if self.tiers is not None else None
        store = JobStore(parts.client, keys)
        # What this node acts on is checked against what it knows itself (job/verify.py).
        store.check = RecordCheck(keys.record, config.job.nproc_per_node, store.read_lease)
        self.peers = _peers(config, parts.waker.wake)
        handed = AgentParts(
            health=self._health,
            metrics=self.metrics,
            log_context=parts.context,
            notifier=parts.notifier,
            keeper=parts.keeper.fence(config.job.id),
            tiers=self.tiers,
            replicas=self.replicas,
            peers=self.peers,
        )
        self.agent = Agent(
            config, store, self.supervisor, dict(os.environ), parts=handed, until_done=until_done
        )
        self.agent.metrics_address = parts.metrics_address()
        # The leader is woken by every node's events and by commands; a follower only when the
        # record moves (its wake stream): at 10,000 nodes, every node reading every node's
        # events would be 10^8 entries a re-form.
        self._listener = StreamListener(
            JobStore(parts.listen_client, keys),
            lambda: (keys.wake, keys.events, keys.commands) if self.agent.leading else (keys.wake,),
            parts.waker.wake,
            LISTEN_BLOCK_MS,
        )
        # Before the agent's first sync: a peer that joins after it wakes it at once.
        self._listener.start(ready_within=1.0)

    @property
    def left(self) -> bool:
        return self.agent.left

    @property
    def uid(self) -> int:
        """Whom its workers run as."""
        return self._user.uid if self._user is not None else os.getuid()

    def command(self, order: RunOrder) -> Command:
        """Start a command its user runs in it here (nodeagentctl run), with the GPUs it
        holds here. Raises OSError: it cannot be started."""
        usable = self._health.usable
        return self.supervisor.command(
            order.argv, order.rank, order.size, usable, order.env, order.window, order.stdin
        )

    @property
    def adoptable(self) -> bool:
        """A login of its user can be taken into it here (its cgroup: not in containers, nor on
        a node that keeps none)."""
        return self.supervisor.adoptable

    def adopt(self, pid: int) -> None:
        """Take a login of its user into its cgroup here (runtime/logins.py), from the
        login socket's thread. Raises OSError: it cannot be."""
        self.supervisor.adopt(pid)

    def here(self) -> JobHere:
        """Its user and its live ranks on this node, for a request to its agent (the metrics
        server's thread asks: `workers()` reads a whole list)."""
        workers = self.supervisor.workers()
        ranks = tuple(RankHere(w.rank, w.pid) for w in workers if w.pid and w.exit_code is None)
        tracer = self.supervisor.tracer
        return JobHere(self.uid, ranks, lambda pid, native: py_spy_dump(pid, native, tracer))

    @property
    def outcome(self) -> int | None:
        return self.agent.outcome

    def _acting(self) -> None:
        self._context.job, self._context.generation = self.job_id, self._generation

    def _acted(self) -> None:
        self._generation = self._workers_context.generation = self._context.generation

    def step(self) -> float:
        self._acting()
        try:
            return self.agent.step()
        finally:
            self._acted()

    def critical_at(self) -> float | None:
        return self.agent.critical_at()

    def request_stop(self) -> None:
        self._acting()
        self.agent.request_stop()

    def healthz(self) -> tuple[bool, str]:
        return self.agent.healthz()

    def unfit(self) -> str | None:
        return self._health.unfit

    def drained(self) -> str | None:
        """Why the job drained this node (by whom, the reason), while its cordon says so."""
        cordon = self.agent.drained_from_job
        return None if cordon is None else f"{cordon.by}: {cordon.reason}"

    def pulled(self, ready: Pulled) -> None:
        """The job's image was made ready on this node before its agent started (the pull
        phase): said in the job's events and the node's metrics."""
        self.metrics.image_pull.labels(self.job_id, ready.image).set(ready.seconds)
        how = f"pulled in {ready.seconds:.1f}s" if ready.seconds else "already present"
        self.agent.note(
            Event(
                "image_ready",
                node=self.agent.name,
                message=f"image {ready.image}: {how}",
                data={"image": ready.image, "seconds": round(ready.seconds, 3)},
            )
        )

    def close(self, keep_tiers: bool = True) -> None:
        """`keep_tiers`: the agent stops, and its memory tier must outlive it; otherwise this
        node left the job (placed elsewhere: persisted on the way out) and the tier goes."""
        self._acting()
        try:
            self._close(keep_tiers)
        finally:
            self._on_close()

    def _close(self, keep_tiers: bool) -> None:
        self.supervisor.close()
        self._listener.stop()
        if self.peers is not None:
            self.peers.close()
        if self.tiers is not None and not keep_tiers:
            self.tiers.remove()
        if self.replicas is not None:
            if keep_tiers:
                self.replicas.close()
            else:
                self.replicas.remove()
