"""The pool's gauges: nodes and jobs by state and by queue, how long jobs have waited, and the
preemptions this node made as leader.

Only the pool leader exports the pool's figures (every agent exports whether it leads), so a
query over the whole fleet counts each node and job once. They are taken from the view the
leader's last round scheduled from (`PoolMember.last_view`: one round a pool heartbeat), at
Redis server time, so they are at most one heartbeat old and never depend on a node's clock.

`pool_figures(view)` is pure; `PoolCollector` reads the member's last view at scrape time, on
the HTTP server's thread. It takes no lock: the loop only ever assigns a new reference to
`last_view` (atomic in Python), and a PoolView is frozen and never changed once built.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from nodeagent.model.pool import PoolJobState
from nodeagent.model.queues import DEFAULT, QueueView
from nodeagent.pool.ledger import Bookkeeper
from nodeagent.pool.schedule import NodeView, PoolView

# A node counts once, under the first of these that holds: unhealthy (its GPUs cannot take a
# job), cordoned (an operator's pool cordon), busy (placed on a job, or pinned to one), free.
NODE_STATES = ("free", "busy", "cordoned", "unhealthy")
# Ended jobs are left out: the leader's view holds an ended job only until its nodes are back
# (read_view), so a count of them would mean nothing. `nodeagentctl jobs` lists them.
JOB_STATES = (PoolJobState.PENDING.value, PoolJobState.RUNNING.value)


@dataclass(frozen=True)
class PoolFigures:
    """What the pool leader exports: counts by state, and waits in seconds."""

    nodes: Mapping[str, int]  # every state of NODE_STATES, 0 included
    jobs: Mapping[str, int]  # every state of JOB_STATES, 0 included
    head_wait_s: float  # the first pending job in order (priority, then FIFO); 0: none pends
    pending_s: Mapping[str, float]  # each pending job's wait
    queues: Mapping[str, QueueFigures]  # every queue that exists or holds a job
    users: Mapping[str, str] = field(default_factory=dict)  # each pending job's user


@dataclass(frozen=True)
class QueueFigures:
    nodes: int  # nodes its jobs hold
    pending: int  # its pending jobs
    longest_wait_s: float  # its longest-waiting pending job's wait; 0: none pends
    quota: int | None
    guaranteed: int
    gpus: int = 0  # GPU units its jobs hold (as its GPU quota counts them)
    gpu_quota: int | None = None
    gpu_guaranteed: int = 0


def node_state(
    node: NodeView, placements: Mapping[str, str], shares: Mapping[str, object] | None = None
) -> str:
    """The one state a node counts under (the first of unhealthy, cordoned, busy, free); a
    node jobs share is busy."""
    if node.unfit is not None:
        return "unhealthy"
    if node.cordoned is not None:
        return "cordoned"
    if node.pinned is not None or node.name in placements or node.name in (shares or {}):
        return "busy"
    return "free"


def pool_figures(view: PoolView) -> PoolFigures:
    """The pool's figures in `view` (the nodes holding a live pool lease, the jobs not ended)."""
    nodes = dict.fromkeys(NODE_STATES, 0)
    for node in view.nodes.values():
        nodes[node_state(node, view.placements, view.shares)] += 1
    jobs = dict.fromkeys(JOB_STATES, 0)
    for job in view.jobs.values():
        if job.status.state.value in jobs:
            jobs[job.status.state.value] += 1
    pending = sorted(
        (j for j in view.jobs.values() if j.status.state is PoolJobState.PENDING),
        key=lambda j: j.order,
    )
    waits = {j.id: max(0, view.now_ms - j.status.submitted_ms) / 1000 for j in pending}
    head = waits[pending[0].id] if pending else 0.0
    users = {j.id: j.user for j in pending}
    return PoolFigures(nodes, jobs, head, waits, _queue_figures(view, waits), users)


def _queue_figures(view: PoolView, waits: Mapping[str, float]) -> dict[str, QueueFigures]:
    queues = {DEFAULT: QueueView(DEFAULT), **view.queues}
    names = {*queues, *(j.queue for j in view.jobs.values())}
    held: dict[str, int] = dict.fromkeys(names, 0)
    gpus: dict[str, int] = dict.fromkeys(names, 0)
    for node, job_id in view.placements.items():
        job = view.jobs.get(job_id)
        if job is not None:
            held[job.queue] += 1
            gpus[job.queue] += view.whole_gpus(node, job_id)
    for shares in view.shares.values():
        for job_id, units in shares.items():
            job = view.jobs.get(job_id)
            if job is not None:
                held[job.queue] += 1  # a node shared counts once for each job sharing it
                gpus[job.queue] += units
    found = {}
    for name in sorted(names):
        queue = queues.get(name, QueueView(name))
        mine = [waits[j.id] for j in view.jobs.values() if j.queue == name and j.id in waits]
        found[name] = QueueFigures(
            held[name],
            len(mine),
            max(mine, default=0.0),
            queue.quota,
            queue.guaranteed,
            gpus[name],
            queue.gpu_quota,
            queue.gpu_guaranteed,
        )
    return found


class PoolLeadership(Protocol):
    """What the collector reads of a pool member (nodeagent.pool.member.PoolMember)."""

    @property
    def leading(self) -> bool: ...
    @property
    def last_error(self) -> str | None: ...
    @property
    def last_view(self) -> PoolView | None: ...
    @property
    def preemptions(self) -> Mapping[str, int]: ...
    @property
    def redis_errors(self) -> int: ...
    @property
    def beaten_at(self) -> float | None: ...
    @property
    def bookkeeper(self) -> Bookkeeper | None: ...


class PoolCollector(Collector):
    """`nodeagent_pool_*` of one node: whether it leads its pool, its own pool heartbeat and
    failed pool calls (a node serving no job has no job heartbeat: its pool's is what says it
    is alive and reaches Redis), and, on the leader, the figures of the last round. A leader
    whose last pool call failed exports no figures (it may have lost the lease without knowing
    it yet)."""

    def __init__(self, member: PoolLeadership, pool: str) -> None:
        self._member = member
        self._pool = pool

    def collect(self) -> Iterable[Metric]:
        view = self._member.last_view
        leads = self._member.leading and self._member.last_error is None
        leader = GaugeMetricFamily(
            "nodeagent_pool_leader",
            "1 on the node holding the pool leader lease (it exports the pool's figures)",
            labels=["pool"],
        )
        leader.add_metric([self._pool], 1.0 if leads else 0.0)
        yield leader
        preemptions = CounterMetricFamily(
            "nodeagent_pool_preemptions",
            "Jobs this node, as pool leader, shrank (kind=shrink) or evicted (kind=evict) for a "
            "job of higher priority or a queue below its guaranteed share",
            labels=["pool", "kind"],
        )
        for kind in ("shrink", "evict"):
            preemptions.add_metric([self._pool, kind], self._member.preemptions.get(kind, 0))
        yield preemptions
        errors = CounterMetricFamily(
            "nodeagent_pool_redis_errors",
            "This node's pool calls that Redis failed (its heartbeat, and as leader its rounds)",
            labels=["pool"],
        )
        errors.add_metric([self._pool], self._member.redis_errors)
        yield errors
        beaten = self._member.beaten_at
        if beaten is not None:
            heartbeat = GaugeMetricFamily(
                "nodeagent_pool_last_heartbeat_timestamp_seconds",
                "When this node last renewed its pool lease",
                labels=["pool"],
            )
            heartbeat.add_metric([self._pool], beaten)
            yield heartbeat
        if leads and view is not None:
            yield from self._figures(pool_figures(view))
        keeper = self._member.bookkeeper
        if leads and keeper is not None:  # what a node read while it led goes stale after
            yield from self._accounting(keeper)

    def _accounting(self, keeper: Bookkeeper) -> Iterable[Metric]:
        """The accounting database's backlog (docs/accounting.md): records waiting in Redis,
        and those this node wrote."""
        waiting = GaugeMetricFamily(
            "nodeagent_pool_accounting_waiting",
            "Ended jobs' records waiting in Redis for the accounting database, as the pool "
            "leader last read them (grows while the database cannot be written)",
            labels=["pool"],
        )
        waiting.add_metric([self._pool], keeper.waiting)
        yield waiting
        written = CounterMetricFamily(
            "nodeagent_pool_accounting_written",
            "Records this node wrote to the accounting database (each run once)",
            labels=["pool"],
        )
        written.add_metric([self._pool], keeper.written)
        yield written

    def _figures(self, figures: PoolFigures) -> Iterable[Metric]:
        pool = self._pool
        nodes = self._by_state(
            "nodeagent_pool_nodes",
            "Nodes holding a live pool lease, by state: free, busy, cordoned, unhealthy",
            figures.nodes,
        )
        jobs = self._by_state(
            "nodeagent_pool_jobs",
            "Jobs of the pool by state: pending, running (ended ones are not counted)",
            figures.jobs,
        )
        head = GaugeMetricFamily(
            "nodeagent_pool_queue_head_wait_seconds",
            "How long the first pending job (priority, then FIFO) has waited; 0 if none pends",
            labels=["pool"],
        )
        head.add_metric([pool], figures.head_wait_s)
        pending = GaugeMetricFamily(
            "nodeagent_pool_job_pending_seconds",
            "How long each pending job has waited since it was submitted",
            labels=["pool", "job_id", "user"],  # user: Alertmanager routes to the submitter
        )
        for job_id, waited in sorted(figures.pending_s.items()):
            pending.add_metric([pool, job_id, figures.users.get(job_id, "")], waited)
        return (nodes, jobs, head, pending, *self._queues(figures))

    def _queues(self, figures: PoolFigures) -> Iterable[Metric]:
        def gauge(name: str, documentation: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, documentation, labels=["pool", "queue"])

        nodes = gauge("nodeagent_pool_queue_nodes", "Nodes the queue's jobs hold")
        pending = gauge("nodeagent_pool_queue_pending_jobs", "The queue's pending jobs")
        waited = gauge(
            "nodeagent_pool_queue_pending_seconds",
            "How long the queue's longest-waiting pending job has waited; 0 if none pends",
        )
        quota = gauge("nodeagent_pool_queue_quota_nodes", "The queue's quota (queues with one)")
        share = gauge("nodeagent_pool_queue_guaranteed_nodes", "The queue's guaranteed share")
        gpus = gauge("nodeagent_pool_queue_gpus", "GPU units the queue's jobs hold")
        gpu_quota = gauge("nodeagent_pool_queue_quota_gpus", "The queue's GPU quota (if any)")
        gpu_share = gauge(
            "nodeagent_pool_queue_guaranteed_gpus", "The queue's guaranteed share of GPU units"
        )
        for name, q in figures.queues.items():
            labels = [self._pool, name]
            nodes.add_metric(labels, q.nodes)
            pending.add_metric(labels, q.pending)
            waited.add_metric(labels, q.longest_wait_s)
            share.add_metric(labels, q.guaranteed)
            gpus.add_metric(labels, q.gpus)
            gpu_share.add_metric(labels, q.gpu_guaranteed)
            if q.quota is not None:
                quota.add_metric(labels, q.quota)
            if q.gpu_quota is not None:
                gpu_quota.add_metric(labels, q.gpu_quota)
        return (nodes, pending, waited, quota, share, gpus, gpu_quota, gpu_share)

    def _by_state(self, name: str, documentation: str, counts: Mapping[str, int]) -> Metric:
        family = GaugeMetricFamily(name, documentation, labels=["pool", "state"])
        for state, count in counts.items():
            family.add_metric([self._pool, state], count)
        return family
