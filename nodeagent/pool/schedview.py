"""What the pool's scheduler decides from, and what it decides: plain frozen dataclasses."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from nodeagent.model.depend import Dependency
from nodeagent.model.gpus import gpus_needed, shares_nodes
from nodeagent.model.job import Event
from nodeagent.model.pool import PoolJob, PoolJobState
from nodeagent.model.queues import QueueView
from nodeagent.model.resources import job_memory
from nodeagent.state import JobState


@dataclass(frozen=True)
class NodeView:
    """A node that holds a live pool lease."""

    name: str
    pinned: str | None = None
    unfit: str | None = None  # its GPUs cannot take a job
    cordoned: str | None = None  # an operator's pool cordon
    drained: bool = False  # ... that also takes it off its job now
    refused: Mapping[str, str] = field(default_factory=dict)  # jobs it cannot run -> why
    labels: Mapping[str, str] = field(default_factory=dict)
    serving: str | None = None  # the job its agent runs now (its workers may be stopping)
    gpus: int = 0  # the GPU units it offers (model/gpus.py), held or free
    sharing: tuple[str, ...] = ()  # the jobs sharing it whose agents run here now
    memory: int = 0  # the bytes its jobs share (0: not said; no memory counted here)
    mem_per_gpu: int = 0  # ... and the default share of one GPU unit
    cpus_per_gpu: int = 0  # the CPUs each GPU unit holds of its own (0: none counted here)

    @property
    def eligible(self) -> bool:
        return self.unfit is None and self.cordoned is None and self.pinned is None


@dataclass(frozen=True)
class JobView:
    """A job as the pool leader sees it: its pool status, its spec's bounds, its own record."""

    id: str
    status: PoolJob
    min_nodes: int
    max_nodes: int
    target_nodes: int  # the record's when it has one (scale), else the spec's
    priority: int = 0
    queue: str = "default"
    record_state: JobState | None = None  # None: no record (yet), or unreadable
    members: tuple[str, ...] = ()
    cancel: str | None = None  # who asked to cancel it
    invalid: str | None = None  # its spec cannot be read: it fails
    selector: Mapping[str, str] = field(default_factory=dict)  # labels a node must have
    preemptible: bool = False  # may be evicted whole for a job of higher priority
    time_limit_ms: int | None = None  # how long it may run once admitted
    signal: tuple[str, int] | None = None  # (USR1, ms before the time limit)
    held: str | None = None  # who holds it (a pending job is not admitted while held)
    requeue: str | None = None  # who asked to put this run back in the queue
    exit_code: int | None = None  # its record's, once the record has ended
    standby: bool = False  # holds a free node beyond its target (slow_node.policy: replace)
    dependency: tuple[Dependency, ...] = ()  # what must hold before it is admitted
    dependency_runs: Mapping[str, int] = field(default_factory=dict)  # parent -> its run's seq
    user: str = ""
    name: str = ""  # its spec's name, else its id (singleton)
    array: str | None = None  # the array it is a task of (model/array.py)
    array_limit: int | None = None  # ... which runs at most this many tasks at once
    notify: tuple[str, ...] = ()  # what its user asked to be told of (model/notify.py)
    fair_share: float = 0.0  # added to its priority: weight x its user's factor (fairshare.py)
    gpus_per_node: int | None = None  # GPU units it holds on each node (None: the whole node)
    exclusive: bool = False  # whole nodes whatever it asks for
    mem: int | None = None  # bytes it asks for on each node
    mem_per_gpu: int | None = None  # ... or per GPU unit it holds there
    cpus_per_gpu: int | None = None  # CPUs of its own per GPU unit it holds (shared nodes)
    kind: str = "batch"  # model/spec.py's KINDS: an allocation is admitted as any job
    attended: bool = False  # ... held from a terminal, whose lease keeps it (pool/holders.py)

    @cached_property  # (asked for each job several times a round)
    def shared(self) -> bool:
        """It asked for GPUs, not whole nodes: it shares its nodes (model/gpus.py)."""
        return shares_nodes(self.gpus_per_node, self.exclusive)

    @property
    def order(self) -> tuple[float, int]:
        return (-(self.priority + self.fair_share), self.status.seq)

    @property
    def asks_memory(self) -> bool:
        return self.mem is not None or self.mem_per_gpu is not None

    def memory_on(self, node: NodeView, units: int | None = None) -> int:
        """The memory it has on `node` (model/resources.py, as that node's agent will limit
        it), holding `units` GPU units of it (None: placed on it whole)."""
        whole = units is None or node.gpus == 0
        held = node.gpus if units is None else units
        return job_memory(node.memory, node.mem_per_gpu, self.mem, self.mem_per_gpu, held, whole)


@dataclass(frozen=True)
class PoolView:
    now_ms: int
    nodes: Mapping[str, NodeView]
    jobs: Mapping[str, JobView]
    placements: Mapping[str, str]  # node -> job, as committed: whole-node jobs
    queues: Mapping[str, QueueView] = field(default_factory=dict)  # `default` is implicit
    # how the jobs not in `jobs` ended (kept for pool.keep_ended): what dependencies look at
    ended: Mapping[str, PoolJobState] = field(default_factory=dict)
    # how each ended run a dependency names ended, by "id:seq" (an id taken over since: its
    # earlier run, from the pool's history)
    runs: Mapping[str, PoolJobState] = field(default_factory=dict)
    # node -> job -> the GPU units it holds there: the nodes jobs that asked for GPUs share
    shares: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

    def whole_gpus(self, node: str, job: str) -> int:
        """The GPU units `job`, placed on `node` whole, holds there: what it asked for, or every
        unit the node offers (model/gpus.py)."""
        found, view = self.jobs.get(job), self.nodes.get(node)
        offered = view.gpus if view is not None else 0
        if found is None:
            return offered
        return gpus_needed(found.gpus_per_node, offered, found.exclusive)


@dataclass(frozen=True)
class SchedulePolicy:
    reserve_after_ms: int = 300_000
    resize_cooldown_ms: int = 60_000  # a job is shrunk or grown back at most this often
    preempt_after_ms: int = 0  # a pending job preempts only after waiting this long
    keep_ended_ms: int = 7 * 86_400_000  # an ended job is pruned after this (pool/lifecycle.py)
    ride_through_ms: int = 0  # a lapsed node keeps its jobs this long, while they count it


@dataclass(frozen=True)
class Schedule:
    placements: dict[str, str]  # node -> job, all of them
    jobs: dict[str, PoolJob] = field(default_factory=dict)  # statuses that changed
    events: tuple[Event, ...] = ()
    shares: dict[str, dict[str, int]] = field(default_factory=dict)  # node -> job -> units

    def changed(
        self, before: Mapping[str, str], shares: Mapping[str, Mapping[str, int]] | None = None
    ) -> bool:
        was = {n: dict(s) for n, s in (shares or {}).items()}
        return bool(self.jobs) or self.placements != dict(before) or self.shares != was


class Lacking:
    """The nodes that lack a selector's labels, matched once per distinct label set and once
    per distinct selector: a queue of many jobs that ask for the same labels costs nodes +
    jobs, not nodes x jobs."""

    def __init__(self, nodes: Iterable[NodeView]) -> None:
        self._groups: dict[frozenset[tuple[str, str]], list[str]] = {}
        for node in nodes:
            self._groups.setdefault(frozenset(node.labels.items()), []).append(node.name)
        self._found: dict[frozenset[tuple[str, str]], frozenset[str]] = {}

    def __call__(self, selector: Mapping[str, str]) -> frozenset[str]:
        key = frozenset(selector.items())
        found = self._found.get(key)
        if found is None:
            found = frozenset(
                name
                for labels, names in self._groups.items()
                if not matches(dict(labels), selector)
                for name in names
            )
            self._found[key] = found
        return found


class Short:
    """The nodes that offer fewer than K of something (GPU units; `count` says how many a node
    offers, None: it says nothing, never short), found once per distinct K (as Lacking)."""

    def __init__(
        self, nodes: Iterable[NodeView], count: Callable[[NodeView], int | None] = lambda n: n.gpus
    ) -> None:
        self._by_count: dict[int, list[str]] = {}
        for node in nodes:
            offered = count(node)
            if offered is not None:
                self._by_count.setdefault(offered, []).append(node.name)
        self._found: dict[int, frozenset[str]] = {}

    def __call__(self, wanted: int) -> frozenset[str]:
        found = self._found.get(wanted)
        if found is None:
            found = frozenset(
                name for count, names in self._by_count.items() if count < wanted for name in names
            )
            self._found[wanted] = found
        return found


class Small:
    """The nodes whose memory for jobs is less than a job asks for there (as Short: found once
    per distinct node shape and ask). Nodes that say nothing of their memory are never small."""

    def __init__(self, nodes: Iterable[NodeView]) -> None:
        self._by_shape: dict[tuple[int, int, int], list[NodeView]] = {}
        for node in nodes:
            if node.memory > 0:
                shape = (node.memory, node.mem_per_gpu, node.gpus)
                self._by_shape.setdefault(shape, []).append(node)
        self._found: dict[tuple[object, ...], frozenset[str]] = {}

    def __call__(self, job: JobView) -> frozenset[str]:
        units = job.gpus_per_node if job.shared else None
        key = (job.mem, job.mem_per_gpu, units)
        found = self._found.get(key)
        if found is None:
            found = frozenset(
                node.name
                for (memory, _, _), nodes in self._by_shape.items()
                if job.memory_on(nodes[0], units) > memory
                for node in nodes
            )
            self._found[key] = found
        return found


def matches(labels: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())
