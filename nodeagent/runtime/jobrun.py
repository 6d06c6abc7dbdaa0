"""Wiring one job's agent on this node: what is the node's (the Redis client, the GPU monitor,
the fence keeper, the wake-ups) is shared; the job's store, supervisor, stream listener and
metrics are its own, made when the node starts serving the job and closed when it leaves.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from nodeagent import __version__
from nodeagent.checkpoint.keeper import TierKeeper
from nodeagent.checkpoint.replicas import Replicas
from nodeagent.config.settings import Config
from nodeagent.coord.client import Redis
from nodeagent.coord.keys import JobKeys
from nodeagent.coord.listener import StreamListener
from nodeagent.coord.store import JobStore
from nodeagent.gpu.health import NodeHealth
from nodeagent.gpu.monitor import GpuMonitor
from nodeagent.job.agent import Agent
from nodeagent.job.verify import RecordCheck
from nodeagent.runtime.wakeup import Waker
from nodeagent.supervisor.fence import Keeper
from nodeagent.supervisor.group import Supervisor
from nodeagent.supervisor.spares import Spawner
from nodeagent.telemetry.logs import LogContext, WorkerEcho
from nodeagent.telemetry.metrics import AgentMetrics
from nodeagent.telemetry.sdnotify import Notifier

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


class CurrentJobMetrics(Collector):
    """The /metrics of whichever job the node serves now (none: nothing)."""

    def __init__(self) -> None:
        self.registry: CollectorRegistry | None = None

    def collect(self) -> Iterable[Metric]:
        registry = self.registry
        return registry.collect() if registry is not None else ()


def _tiers(config: Config) -> TierKeeper | None:
    """The job's checkpoint tiers on this node, made for its workers' user (job.checkpoint)."""
    checkpoint = config.job.checkpoint
    if checkpoint is None:
        return None
    keeper = TierKeeper(checkpoint, config.node.name, config.job.id)
    user = config.job.user
    keeper.prepare(user.uid if user is not None and user.switch else None)
    return keeper


def _replicas(config: Config) -> Replicas | None:
    """The job's replica area on this node (job.checkpoint.replicas), readable by its workers."""
    checkpoint = config.job.checkpoint
    if checkpoint is None or not checkpoint.replicas:
        return None
    replicas = Replicas(checkpoint, config.node.name, config.job.id, config.node.address)
    user = config.job.user
    replicas.prepare(user.gid if user is not None and user.switch else None)
    return replicas


class JobRun:
    """One job's Agent on this node, and what only it uses."""

    def __init__(self, config: Config, parts: NodeParts, until_done: bool = False) -> None:
        self.job_id = config.job.id
        keys = JobKeys(config.redis.key_prefix, config.job.id)
        parts.context.job = config.job.id
        parts.context.generation = 0
        self.supervisor = Supervisor(
            echo=WorkerEcho(config.logging.format, parts.context),
            wake=parts.waker.wake,
            spawner=Spawner(config.job.preload, config.job.user),
        )
        self.metrics = AgentMetrics(config.job.id, __version__)
        monitor = parts.monitor
        self.metrics.watch_gpus(monitor.snapshot, monitor.verdicts, monitor.xid_counts)
        job = config.job
        needed = job.nproc_per_node * job.gpus_per_worker
        self._health = NodeHealth(config.node.name, config.health, needed, monitor)
        self.tiers = _tiers(config)
        self.replicas = _replicas(config) if self.tiers is not None else None
        store = JobStore(parts.client, keys)
        # What this node acts on is checked against what it knows itself (job/verify.py).
        store.check = RecordCheck(keys.record, config.job.nproc_per_node, store.read_lease)
        self.agent = Agent(
            config,
            store,
            self.supervisor,
            base_env=dict(os.environ),
            health=self._health,
            metrics=self.metrics,
            log_context=parts.context,
            notifier=parts.notifier,
            keeper=parts.keeper,
            until_done=until_done,
            tiers=self.tiers,
            replicas=self.replicas,
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
    def outcome(self) -> int | None:
        return self.agent.outcome

    def step(self) -> float:
        return self.agent.step()

    def request_stop(self) -> None:
        self.agent.request_stop()

    def healthz(self) -> tuple[bool, str]:
        return self.agent.healthz()

    def unfit(self) -> str | None:
        return self._health.unfit

    def close(self, keep_tiers: bool = True) -> None:
        """`keep_tiers`: the agent stops, and its memory tier must outlive it; otherwise this
        node left the job (placed elsewhere: persisted on the way out) and the tier goes."""
        self.supervisor.close()
        self._listener.stop()
        if self.tiers is not None and not keep_tiers:
            self.tiers.remove()
        if self.replicas is not None:
            if keep_tiers:
                self.replicas.close()
            else:
                self.replicas.remove()
