"""What GPU verdicts mean for this node's part in the job. Pure.

- An application-level XID on a GPU this node's workers use fails the worker group, so the job
  re-forms as for a crash (it counts against max_restarts).
- A node-level fault (GPU lost, fatal XID, uncorrected ECC, remap failure, a reset or reboot
  asked for) cordons and drains the node: its workers get the full grace period, it leaves the
  job's membership, and it stays out until uncordoned (by an operator, or by itself with
  `health.auto_uncordon` once the condition has cleared). Draining does not count as a restart.
- A node with fewer usable GPUs than nproc_per_node x gpus_per_worker does not take part. A GPU
  in MIG mode counts as its MIG instances, each handed out by its own UUID (`hand_out`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from nodeagent.gpu.classify import APPLICATION_XIDS, Verdict
from nodeagent.gpu.readings import GpuReading
from nodeagent.model.job import Cordon

GPU_CORDON = "gpu"  # Cordon.by for cordons the agent sets itself
Device = tuple[int, str]  # what a worker is handed: its GPU's NVML index, the UUID to use


@dataclass(frozen=True)
class GpuDecision:
    usable: tuple[int, ...] | None  # GPU indices for CUDA_VISIBLE_DEVICES; None: no monitoring
    unfit: str | None  # why the node cannot take part, if it cannot
    cordon: Cordon | None  # a cordon to set now
    uncordon: bool  # lift this node's GPU cordon now
    xid_failure: tuple[int, int] | None  # (GPU, XID) that fails the running workers


def decide_gpus(
    available: bool,
    verdicts: Sequence[Verdict],
    new_xids: Sequence[tuple[int, int]],
    cordon: Cordon | None,
    gpus_in_use: Sequence[int],
    gpus_needed: int,
    auto_uncordon: bool,
    units: Mapping[int, int] | None = None,
) -> GpuDecision:
    """`units`: how many units each GPU gives (a GPU in MIG mode: the MIG instances made on it;
    1 when not named): the node takes part only if its usable GPUs give `gpus_needed`."""
    if not available:
        return GpuDecision(None, None, None, False, None)
    usable = tuple(v.index for v in verdicts if not v.drains)
    give = units or {}
    count = sum(give.get(i, 1) for i in usable)
    unfit = None
    if count < gpus_needed:
        total = sum(give.get(v.index, 1) for v in verdicts)
        empty = [i for i in usable if give.get(i, 1) == 0]
        why = (
            f" (GPU {', '.join(map(str, empty))} in MIG mode with no MIG instance made: "
            f"nvidia-smi mig -i {empty[0]} -cgi ... -C, or disable MIG)"
            if empty
            else ""
        )
        unfit = f"{count} usable GPUs of {total}, the job needs {gpus_needed}{why}"
    draining = [v for v in verdicts if v.drains]
    new_cordon = None
    if draining and cordon is None:
        worst = draining[0]
        new_cordon = Cordon(
            reason=f"GPU {worst.index}: {worst.reason} (suggested: {worst.action.value})",
            by=GPU_CORDON,
            drain=True,
        )
    lift = auto_uncordon and cordon is not None and cordon.by == GPU_CORDON and not draining
    in_use = set(gpus_in_use)
    failing = next(
        ((gpu, xid) for gpu, xid in new_xids if xid in APPLICATION_XIDS and gpu in in_use), None
    )
    return GpuDecision(usable, unfit, new_cordon, lift, failing)


def hand_out(usable: Sequence[int], gpus: Sequence[GpuReading]) -> tuple[Device, ...]:
    """The devices the usable GPUs give, in order: each GPU by its UUID ("" when NVML gave
    none: handed out by index), a GPU in MIG mode as each of its MIG instances."""
    by_index = {g.index: g for g in gpus}
    found: list[Device] = []
    for index in usable:
        gpu = by_index.get(index)
        if gpu is not None and gpu.mig:
            found += [(index, m.uuid) for m in gpu.mig_devices]
        else:
            found.append((index, gpu.uuid if gpu is not None else ""))
    return tuple(found)
