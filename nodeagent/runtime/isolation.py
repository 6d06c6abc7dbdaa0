"""What keeps the jobs on this node apart, wired: the node's job cgroups and private /dev/shm
checked at start (`node_cgroups`, `node_space`), and each job's cgroup with its limits
(`job_cgroup`), device program (`job_devices`) and /dev/shm and temp directory (`job_space`)
made for its agent (docs/isolation.md).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import pwd
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path

import psutil

from nodeagent.config.identity import WorkerUser
from nodeagent.config.isolation import IsolationConfig
from nodeagent.config.settings import Config, NodeSettings
from nodeagent.errors import ConfigError
from nodeagent.gpu.affinity import parse_cpu_list
from nodeagent.gpu.health import NodeHealth
from nodeagent.gpu.monitor import GpuMonitor
from nodeagent.gpu.readings import GpuSnapshot
from nodeagent.model import cores
from nodeagent.model.resources import Capacity, LimitError, Limits, limits_for
from nodeagent.supervisor.asuser import run_as
from nodeagent.supervisor.devices import JobDevices, probe
from nodeagent.supervisor.jobcgroup import (
    CONTROLLERS,
    UNIFIED,
    JobCgroup,
    JobCgroupError,
    Layout,
    read_layout,
    settle,
    sweep,
)
from nodeagent.supervisor.jobspace import JobSpace, JobSpaceError, probe_space

log = logging.getLogger(__name__)
# A limit file each controller has, in v2 and v1 (written back as read: the probe of a node)
_PROBED = {
    "memory": ("memory.max", "memory.limit_in_bytes"),
    "pids": ("pids.max", "pids.max"),
    "cpu": ("cpu.weight", "cpu.shares"),
    "cpuset": ("cpuset.cpus", "cpuset.cpus"),
}
_TOPOLOGY = Path("/sys/devices/system/cpu")
_UNIT = (
    "under systemd, the shipped unit gives it (Delegate=yes, ProtectControlGroups=no); a "
    "kernel without a controller needs it enabled (cgroup_enable=memory, say)"
)


def node_cgroups(config: NodeSettings) -> Layout | None:
    """Where this node's job cgroups go, checked by making one: None where it makes none
    (isolation.cgroups: off and no device program). What earlier agents of this node left in
    job cgroups is ended here.

    Raises:
        ConfigError: the node lacks what `isolation.cgroups: required` or
            `health.constrain_devices` needs (exit 78: a restart cannot fix it).
    """
    isolation = config.isolation
    devices = config.health.constrain_devices
    if not isolation.on and not devices:
        return None
    wanted = CONTROLLERS if isolation.on else ()
    try:
        layout = read_layout(wanted)
        settle(layout)
    except JobCgroupError as exc:
        raise ConfigError(
            "isolation.cgroups",
            f"this node cannot keep its jobs apart: {exc.strerror}; {_UNIT}; or set "
            "isolation.cgroups: off",
        ) from None
    lacking = {name: "not mounted" for name in layout.missing()} if isolation.on else {}
    lacking.update(_unwritable(layout, config.node.name))
    if layout.unified is None and isolation.on:
        lacking[UNIFIED] = "no cgroup v2 hierarchy holds the agent"
    if lacking and isolation.cgroups == "required" and set(lacking) - _soft(layout):
        said = "; ".join(f"{name}: {why}" for name, why in sorted(lacking.items()))
        raise ConfigError(
            "isolation.cgroups",
            f"this node cannot limit its jobs' {', '.join(sorted(lacking))} ({said}); {_UNIT};"
            " or set isolation.cgroups: available to run with what it has",
        )
    if lacking:
        log.warning(
            "isolation.cgroups: available: jobs on this node are not limited in %s (%s)",
            ", ".join(sorted(lacking)),
            "; ".join(f"{name}: {why}" for name, why in sorted(lacking.items())),
        )
        layout = layout.without(lacking)
        if not layout.parents:
            return None
    if devices:
        _probe_devices(layout, config.node.name)
    killed = sweep(layout, config.node.name, config.job.id if config.job is not None else None)
    if killed:
        log.warning("ended %d processes an earlier agent's jobs left in their cgroups", killed)
    return layout


def _soft(layout: Layout) -> set[str]:
    """What `required` does without: on a v1/v2 hybrid, the v1 cpuset, which systemd never
    delegates (a unit stays in its root); jobs there share CPUs by weight, each worker started
    on its GPUs' CPUs."""
    hybrid = any(parent != layout.unified for parent in layout.parents)
    return {"cpuset"} if hybrid else set()


def _unwritable(layout: Layout, node: str) -> dict[str, str]:
    """The controllers of `layout` whose limits a job cgroup cannot be given here, and why: a
    trial cgroup made below each parent, each controller's limit file written back as read."""
    found: dict[str, str] = {}
    for parent, controllers in layout.parents.items():
        trial = parent / f"probe-{node}.{os.getpid()}"
        names = {*controllers, *((UNIFIED,) if parent == layout.unified else ())}
        try:
            trial.mkdir()
        except OSError as exc:
            found.update({name: f"cannot make {trial}: {exc.strerror}" for name in names})
            continue
        try:
            for name in controllers:
                file = trial / _PROBED[name][0 if parent == layout.unified else 1]
                try:
                    file.write_text(file.read_text())
                except OSError as exc:
                    found[name] = f"cannot write {file}: {exc.strerror}"
        finally:
            with contextlib.suppress(OSError):
                trial.rmdir()
    return found


def _probe_devices(layout: Layout, node: str) -> None:
    if layout.unified is None:
        raise ConfigError(
            "health.constrain_devices",
            "this node cannot confine workers to their GPUs' device nodes: no cgroup v2 "
            "hierarchy holds the agent; or set it false",
        )
    try:
        probe(layout.unified, node)
    except OSError as exc:
        raise ConfigError(
            "health.constrain_devices",
            f"this node cannot confine workers to their GPUs' device nodes: {exc.strerror or exc}."
            " It needs cgroup v2 with the agent's cgroup writable and CAP_BPF with CAP_NET_ADMIN:"
            " under systemd, the drop-in docs/gpu.md gives (Delegate=yes,"
            " ProtectControlGroups=no); or set it false",
        ) from None


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
    return sum(len(g.mig_devices) if g.mig else 1 for g in snapshot.gpus)


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
        for uuid in ([m.uuid for m in g.mig_devices] if g.mig else [g.uuid])
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


_SPACE = (
    "it needs unprivileged user namespaces (Debian: sysctl kernel.unprivileged_userns_clone=1, "
    "and user.max_user_namespaces above 0) and, under systemd, the shipped unit's "
    "RestrictNamespaces= and SystemCallFilter= (they allow user and mount namespaces)"
)


def node_space(config: NodeSettings) -> None:
    """Check that this node can give a job's workers a /dev/shm of their own (isolation.shm:
    private), by giving one to a trial process as `nobody`. Nothing to check where the agent
    does not switch users (not root: its jobs run as itself) or has no `nobody`.

    Raises:
        ConfigError: it cannot (exit 78: a restart cannot fix it).
    """
    if config.isolation.shm != "private" or os.geteuid() != 0:
        return
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        log.warning("isolation.shm: no user nobody here to check private /dev/shm with")
        return
    user = WorkerUser("nobody", nobody.pw_uid, nobody.pw_gid, (), switch=True)
    try:
        probe_space(JobSpace(config.node.name, "probe", user, remove_as_user=remove_as))
    except JobSpaceError as exc:
        raise ConfigError(
            "isolation.shm",
            f"this node cannot give each job a /dev/shm of its own: {exc.strerror}; {_SPACE};"
            " or set isolation.shm: shared",
        ) from None


def remove_as(user: WorkerUser, path: Path) -> None:
    """Remove `path` as `user` (the agent, without CAP_DAC_OVERRIDE, cannot empty the user's
    0700 directory).

    Raises:
        OSError: it could not (what rm said).
    """
    argv = ["rm", "-rf", "--one-file-system", "--", str(path)]
    code, said = run_as(user, argv, b"", most=4096)
    if code != 0:
        raise OSError(f"rm exited {code}: {said.decode(errors='replace').strip()}")


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
    config: Config, monitor: GpuMonitor, limits: Limits | None = None
) -> Callable[[tuple[int, ...]], tuple[int, ...]] | None:
    """Which CPUs a worker of given GPUs (indices) starts on, isolation.cpu_binding: closest:
    where the job holds cores of its own (`limits.cpus`), those of its GPUs' units; else those
    NVML says are near them, of those the agent may use; none (any of the job's) where NVML
    says nothing, or near means all. None: the node does not bind (off, or a job in its own
    image, whose CPUs are its runtime's)."""
    if config.isolation.cpu_binding != "closest" or config.job.container is not None:
        return None
    node = frozenset(os.sched_getaffinity(0))
    own = limits is not None and bool(limits.cpus)
    allowed = frozenset(limits.cpus) if limits is not None and own else node
    held = unit_cores(monitor.snapshot(), node) if own else {}  # divided as capacity() did

    def cpus_of(gpus: tuple[int, ...]) -> tuple[int, ...]:
        snapshot = monitor.snapshot()
        mine = [g for g in snapshot.gpus if g.index in gpus]
        near = {cpu for g in mine for cpu in g.cpus}
        if held:  # the cores of its GPUs' units, as model/cores.py divided the node
            units = {m.uuid for g in mine for m in g.mig_devices} | {g.uuid for g in mine}
            near = {cpu for uuid in units for core in held.get(uuid, ()) for cpu in core}
        bound = near & allowed
        return tuple(sorted(bound)) if bound and bound != allowed else ()

    return cpus_of
