"""What a job may use on one node beside its GPUs, pure: its memory, processes and CPU weight
from the node's capacity, the operator's `isolation:` settings, the job's own ask and the GPU
units it holds there (docs/isolation.md).

Memory: the job's `mem` (the node's whole for the job), else `mem_per_gpu` times its GPUs,
else the node's default per GPU (`isolation.mem_per_gpu`; unset: what is left after the
reserve, shared evenly between the node's GPUs). A job holding the node whole (or a node with
no GPUs known) gets all that is left after the reserve. More than is left is refused, never cut
down: a job that asked for 64 GiB must not run in 40 and die of it an hour in.

CPU time is shared by weight between the jobs (cgroup v2's `cpu.weight`, v1's `cpu.shares`):
each job's weight is its share of the node's CPUs as its share of the GPUs; the cores each job
holds of its own (its `cpuset`) are model/cores.py's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from nodeagent.config.isolation import MIN_WORKER_MEMORY, IsolationConfig
from nodeagent.config.settings import JobConfig
from nodeagent.config.values import size_text

RESERVED_SHARE = 10  # without isolation.reserved_memory: a tenth of the node's memory
WEIGHT_PER_CPU = 100  # cgroup v2's default weight is one CPU's worth
SHARES_PER_WEIGHT = 1024 / 100  # cgroup v1's cpu.shares: its default is 1024, cpu.weight's 100
MAX_WEIGHT = 10_000


def cpu_shares(weight: float) -> int:
    """cgroup v1's `cpu.shares` (and podman's --cpu-shares) of a cpu.weight."""
    return max(2, round(weight * SHARES_PER_WEIGHT))


@dataclass(frozen=True)
class Capacity:
    """What the node has: memory (bytes), CPUs, GPU units (0: none known), and the cores each
    unit holds (model/cores.py; empty: the node divides none)."""

    memory: int
    cpus: int
    units: int
    cores: Mapping[str, tuple[tuple[int, ...], ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Limits:
    """What one job's workers on a node may use together."""

    memory: int  # bytes (memory.max)
    swap: int  # bytes beside it (memory.swap.max)
    pids: int  # processes and threads (pids.max)
    cpu_weight: int  # 1..10000, cgroup v2's scale (cpu.weight)
    cpus: tuple[int, ...] = ()  # the CPUs of its cores (cpuset.cpus, model/cores.py); (): any

    def describe(self) -> str:
        cpus = f", {len(self.cpus)} CPUs of its own" if self.cpus else ""
        return (
            f"memory {size_text(self.memory)}, swap {size_text(self.swap)}, "
            f"{self.pids} processes, CPU weight {self.cpu_weight}{cpus}"
        )


class LimitError(ValueError):
    """The job asks for more than this node can give it, or less than its workers need."""


def reserved(capacity: Capacity, isolation: IsolationConfig) -> int:
    """The memory kept from every job."""
    if isolation.reserved_memory is not None:
        return isolation.reserved_memory
    return capacity.memory // RESERVED_SHARE


def for_jobs(capacity: Capacity, isolation: IsolationConfig) -> int:
    """The memory the node's jobs share: all it has, less the reserve."""
    return max(0, capacity.memory - reserved(capacity, isolation))


@dataclass(frozen=True)
class NodeOffer:
    """What a node offers its jobs beside GPUs, as it tells the pool (PoolNode), so that the
    scheduler counts it as the agent will limit it: the bytes of memory its jobs share, the
    default share of one GPU unit (a job that asks for no memory gets that per unit), and the
    CPUs each unit holds of its own (model/cores.py; 0: none, the jobs share them by weight)."""

    shared: int
    per_gpu: int
    cpus_per_gpu: int = 0


def offer(capacity: Capacity, isolation: IsolationConfig) -> NodeOffer:
    usable = for_jobs(capacity, isolation)
    per_gpu = isolation.mem_per_gpu or (usable // capacity.units if capacity.units else usable)
    held = (sum(len(core) for core in unit) for unit in capacity.cores.values())
    return NodeOffer(usable, per_gpu, min(held, default=0))


def job_memory(
    shared: int, per_gpu: int, mem: int | None, mem_per_gpu: int | None, held: int, whole: bool
) -> int:
    """The memory a job has on a node where it holds `held` GPU units (`whole`: the node
    itself): its `mem`, else `mem_per_gpu` x its units, else all the node's jobs share (whole)
    or the node's default share per unit (`shared`, `per_gpu`: its NodeOffer). (The
    scheduler asks it for every share it packs: plain numbers; `memory_how` says it in
    words.)"""
    if mem is not None:
        return mem
    if mem_per_gpu is not None:
        return mem_per_gpu * max(held, 1)
    return shared if whole else per_gpu * max(held, 1)


def memory_how(
    offered: NodeOffer, mem: int | None, mem_per_gpu: int | None, held: int, whole: bool
) -> str:
    """How job_memory found its figure, in words."""
    if mem is not None:
        return f"mem {size_text(mem)}"
    if mem_per_gpu is not None:
        return f"mem_per_gpu {size_text(mem_per_gpu)} x {max(held, 1)} GPUs"
    if whole:
        return "the node's memory less its reserve"
    return f"the node's {size_text(offered.per_gpu)} per GPU x {max(held, 1)}"


def limits_for(
    capacity: Capacity, isolation: IsolationConfig, job: JobConfig, units: int | None
) -> Limits:
    """The job's limits on this node, holding `units` GPU units of it (None: the whole node).

    Raises:
        LimitError: it asks for more memory than the node's jobs share, or its share is less
            than its workers need to start.
    """
    offered = offer(capacity, isolation)
    usable = offered.shared
    held = capacity.units if units is None else units
    whole = units is None or capacity.units == 0
    memory = job_memory(offered.shared, offered.per_gpu, job.mem, job.mem_per_gpu, held, whole)
    how = memory_how(offered, job.mem, job.mem_per_gpu, held, whole)
    if memory > usable:
        raise LimitError(
            f"asks for {size_text(memory)} of memory ({how}), but this node's jobs share "
            f"{size_text(usable)} ({size_text(capacity.memory)} less "
            f"{size_text(reserved(capacity, isolation))} reserved): ask for less"
        )
    floor = MIN_WORKER_MEMORY * job.nproc_per_node
    if memory < floor:
        raise LimitError(
            f"would have {size_text(memory)} of memory ({how}), less than its "
            f"{job.nproc_per_node} workers need to start ({size_text(floor)}): ask for more"
        )
    cpus = capacity.cpus if whole else capacity.cpus * held / capacity.units
    weight = min(MAX_WEIGHT, max(1, round(cpus * WEIGHT_PER_CPU)))
    return Limits(memory, isolation.swap, isolation.pids_max, weight)
