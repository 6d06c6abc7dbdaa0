"""Each job's parts that keep it apart on this node, made for its agent: its limits from the
node's capacity (`capacity`, `job_limits`: memory, processes, CPU weight, the cores of its GPU
units), its cgroup (`job_cgroup`), device program (`job_devices`), /dev/shm and temp directory
(`job_space`) and the CPUs each worker starts on (`job_cpus`) (docs/isolation.md).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import psutil

from nodeagent.config.isolation import IsolationConfig
from nodeagent.config.settings import Config
from nodeagent.errors import ConfigError
from nodeagent.gpu.affinity import parse_cpu_list
from nodeagent.gpu.health import NodeHealth
from nodeagent.gpu.monitor import GpuMonitor
from nodeagent.gpu.readings import GpuSnapshot
from nodeagent.model import cores
from nodeagent.model.resources import Capacity, LimitError, Limits, limits_for
from nodeagent.runtime.isolation import remove_as
from nodeagent.supervisor.devices import JobDevices
from nodeagent.supervisor.jobcgroup import (
    JobCgroup,
    Layout,
)
from nodeagent.supervisor.jobspace import JobSpace

_TOPOLOGY = Path("/sys/devices/system/cpu")


def node_memory(layout: Layout | None) -> int:
    """The memory this node's jobs are limited within: the machine's, or less where the
    agent's own cgroup has a lower limit (a unit's MemoryMax=, a container's)."""
    total = int(psutil.virtual_memory().total)
    if layout is None:
        return total
    for parent, controllers in layout.parents.items():
        if "memory" not in controllers:
            continue
        name = "memory.max" if parent == layout.unified else "memory.limit_in_bytes"
        with contextlib.suppress(OSError, ValueError):
            total = min(total, int((parent / name).read_text()))
    return total


def gpu_units(snapshot: GpuSnapshot) -> int:
    """The node's GPU units, drained ones too (a drained GPU does not grow the others' share):
    each GPU, or each MIG instance of one in MIG mode."""
    if not snapshot.available:
        return 0
    return sum(len(g.units) for g in snapshot.gpus)


def capacity(layout: Layout | None, monitor: GpuMonitor) -> Capacity:
    cpus = os.sched_getaffinity(0)
    snapshot = monitor.snapshot()
    divided = layout is not None and "cpuset" in layout.controllers
    held = unit_cores(snapshot, cpus) if divided else {}
    return Capacity(node_memory(layout), len(cpus), gpu_units(snapshot), held)


def unit_cores(snapshot: GpuSnapshot, cpus: Iterable[int]) -> dict[str, tuple[cores.Core, ...]]:
    """Each GPU unit's cores of `cpus` (model/cores.py), drained units too: what every agent
    of this node divides alike, from the kernel's thread siblings and NVML's CPU affinity."""
    if not snapshot.available:
        return {}
    units = [
        cores.Unit(uuid, frozenset(g.cpus))
        for g in sorted(snapshot.gpus, key=lambda g: g.index)
        for uuid in g.units
    ]
    return cores.divide(units, cores.cores(cpus, _core_of))


@functools.cache  # (asked at every pool heartbeat; a CPU does not change cores)
def _core_of(cpu: int) -> int:
    """The first CPU of `cpu`'s core (itself where the kernel does not say)."""
    try:
        siblings = (_TOPOLOGY / f"cpu{cpu}" / "topology" / "thread_siblings_list").read_text()
        return min(parse_cpu_list(siblings))
    except (OSError, ValueError):
        return cpu


def job_limits(
    isolation: IsolationConfig, config: Config, room: Capacity, grant: Iterable[str] | None
) -> Limits:
    """The job's limits on this node, holding `grant` (None: the whole node), with the cores
    of the units it holds (model/cores.py).

    Raises:
        ConfigError: it asks for more than the node can give, or too little to start.
    """
    held = None if grant is None else tuple(grant)
    job = config.job
    try:
        limits = limits_for(room, isolation, job, None if held is None else len(held))
    except LimitError as exc:
        key = "job.mem" if job.mem else "job.mem_per_gpu" if job.mem_per_gpu else "isolation"
        raise ConfigError(key, str(exc)) from None
    if held is None or not room.cores:  # the node whole, or no cpuset here: every CPU it has
        return limits
    try:
        return replace(limits, cpus=cores.job_cpus(room.cores, held, job.cpus_per_gpu))
    except LimitError as exc:
        raise ConfigError("job.cpus_per_gpu", str(exc)) from None


def job_cgroup(config: Config, layout: Layout | None, limits: Limits | None) -> JobCgroup | None:
    """The job's cgroup on this node, where its bare workers run (a container's is its
    runtime's: none here); None where the node makes none."""
    if layout is None or config.job.container is not None:
        return None
    return JobCgroup(layout, config.node.name, config.job.id, limits)


def job_devices(
    config: Config, cgroup: JobCgroup | None, monitor: GpuMonitor, health: NodeHealth
) -> JobDevices | None:
    """The job's device program, when the node constrains devices: its workers may open the
    GPUs the job holds on this node, its grant where it shares the node, the node's usable
    ones where it has it whole (handed to its ranks or not: `gpus_per_worker: 0` leaves that
    to the job)."""
    if cgroup is None or not config.health.constrain_devices:
        return None

    def minor_of(index: int) -> int | None:
        return next((g.minor for g in monitor.snapshot().gpus if g.index == index), None)

    def held() -> set[int]:
        return {index for index, _ in health.usable or ()}

    return JobDevices(cgroup, minor_of, held)


def job_space(config: Config, cgroup: JobCgroup | None, limits: Limits | None) -> JobSpace | None:
    """The job's /dev/shm and temp directory on this node, for its bare workers; None where
    the node shares its own (isolation.shm: shared), for a job in its own image (its container
    has its own), and where its workers run as root or as the agent itself."""
    user, job = config.job.user, config.job
    if config.isolation.shm != "private" or job.container is not None:
        return None
    if user is None or not user.switch or user.uid == 0:
        return None
    shared = [Path(job.checkpoint.memory_dir)] if job.checkpoint is not None else []

    def cgroups() -> tuple[int, ...]:
        if cgroup is None:
            return ()
        cgroup.make()
        return cgroup.procs_fds()

    size = limits.memory if limits is not None else None
    return JobSpace(
        config.node.name, job.id, user, shared, size, cgroups=cgroups, remove_as_user=remove_as
    )


def job_cpus(
    config: Config,
    monitor: GpuMonitor,
    limits: Limits | None = None,
    held: Mapping[str, Sequence[cores.Core]] | None = None,
) -> Callable[[tuple[int, ...]], tuple[int, ...]] | None:
    """Which CPUs a worker of given GPUs (indices) starts on, isolation.cpu_binding: closest:
    where the job holds cores of its own (`limits.cpus`), those of its GPUs' units as `held`
    (the node's division, Capacity.cores) says; else those NVML says are near them, of those
    the agent may use; none (any of the job's) where NVML says nothing, or near means all.
    None: the node does not bind (off, or a job in its own image, whose CPUs are its
    runtime's)."""
    if config.isolation.cpu_binding != "closest" or config.job.container is not None:
        return None
    own = limits.cpus if limits is not None else ()
    allowed = frozenset(own or os.sched_getaffinity(0))
    divided = held if own and held else {}

    def cpus_of(gpus: tuple[int, ...]) -> tuple[int, ...]:
        mine = [g for g in monitor.snapshot().gpus if g.index in gpus]
        near = {cpu for g in mine for cpu in g.cpus}
        if divided:  # the cores of its GPUs' units
            units = [uuid for g in mine for uuid in g.units]
            near = {cpu for uuid in units for core in divided.get(uuid, ()) for cpu in core}
        bound = near & allowed
        return tuple(sorted(bound)) if bound and bound != allowed else ()

    return cpus_of
