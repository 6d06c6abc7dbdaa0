"""Which cores of a node each of its GPU units holds, and so each job that holds units there,
pure (docs/isolation.md, "CPUs").

The node's whole cores are divided between its GPU units: each gets `cores // units` of them
(the node's cores divided by its GPUs, Slurm's `DefCpuPerGPU` alike), taken in unit order from
the cores near its GPU not yet taken (NVML's CPU affinity), then from any left. A job holds the
cores of the units it holds, as it holds their GPUs, written as its cgroup's `cpuset`; with
`cpus_per_gpu` it takes only as many CPUs of each unit's cores (whole cores still).

Every agent of a node divides the same facts the same way (the CPUs the agent may use, which
CPUs share a core, which are near each GPU, the node's units drained ones too), so the jobs
sharing a node never hold one core twice, with no bookkeeping beside the GPU grant. Cores left
over, and every core of a node with more units than cores, are nobody's: there the jobs share
the node's CPUs by weight alone (`cpu.weight`). A job that has the node whole has all of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from nodeagent.model.resources import LimitError

Core = tuple[int, ...]  # the CPUs (hardware threads) of one core, ascending


@dataclass(frozen=True)
class Unit:
    """One GPU unit of the node (a GPU, or a MIG instance of one): its UUID, and the CPUs near
    its GPU (empty: not known)."""

    uuid: str
    near: frozenset[int] = frozenset()


def cores(cpus: Iterable[int], core_of: Callable[[int], int]) -> tuple[Core, ...]:
    """`cpus` grouped by their core (`core_of`: a CPU's core, such as the first CPU of its
    thread siblings), in the order of each core's first CPU."""
    grouped: dict[int, list[int]] = {}
    for cpu in sorted(set(cpus)):
        grouped.setdefault(core_of(cpu), []).append(cpu)
    return tuple(sorted(tuple(group) for group in grouped.values()))


def divide(units: Sequence[Unit], node_cores: Sequence[Core]) -> dict[str, tuple[Core, ...]]:
    """Each unit's cores (the module docstring); every unit's is () where the node has fewer
    cores than units."""
    each = len(node_cores) // len(units) if units else 0
    free = list(node_cores)
    held: dict[str, tuple[Core, ...]] = {}
    for unit in units:
        near = [core for core in free if unit.near.intersection(core)]
        taken = sorted((near + [core for core in free if core not in near])[:each])
        held[unit.uuid] = tuple(taken)
        free = [core for core in free if core not in taken]
    return held


def job_cpus(
    held: Mapping[str, Sequence[Core]], grant: Iterable[str], cpus_per_gpu: int | None
) -> tuple[int, ...]:
    """The CPUs of a job holding `grant` (unit UUIDs) on the node: each unit's cores, or its
    first cores up to `cpus_per_gpu` CPUs; () where the node divides no cores (the job shares
    them by weight).

    Raises:
        LimitError: it asks for more CPUs per GPU than a unit of its has.
    """
    units = [held.get(uuid, ()) for uuid in grant]
    if not units or not all(units):
        if cpus_per_gpu is not None:
            raise LimitError(
                f"asks for {cpus_per_gpu} CPUs per GPU, but this node has fewer cores than GPU "
                "units and holds none for a GPU: ask for none (its jobs share its CPUs by weight)"
            )
        return ()
    chosen: list[int] = []
    for unit in units:
        have = sum(len(core) for core in unit)
        if cpus_per_gpu is not None and cpus_per_gpu > have:
            raise LimitError(
                f"asks for {cpus_per_gpu} CPUs per GPU, but this node holds {have} for each "
                f"({len(unit)} whole cores): ask for {have} or fewer"
            )
        taken = 0
        for core in unit:
            if cpus_per_gpu is not None and taken >= cpus_per_gpu:
                break
            chosen += core
            taken += len(core)
    return tuple(sorted(chosen))
