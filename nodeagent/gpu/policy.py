"""What GPU verdicts mean for this node's part in the job. Pure.

- An application-level XID on a GPU this node's workers use fails the worker group, so the job
  re-forms as for a crash (it counts against max_restarts).
- A node-level fault (GPU lost, fatal XID, uncorrected ECC, remap failure, a reset or reboot
  asked for) cordons and drains the node: its workers get the full grace period, it leaves the
  job's membership, and it stays out until uncordoned (by an operator, or by itself with
  `health.auto_uncordon` once the condition has cleared). Draining does not count as a restart.
- A node with fewer usable GPUs than nproc_per_node x gpus_per_worker does not take part.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nodeagent.gpu.classify import APPLICATION_XIDS, Verdict
from nodeagent.model.job import Cordon

GPU_CORDON = "gpu"  # Cordon.by for cordons the agent sets itself


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
    mig: Sequence[int] = (),
) -> GpuDecision:
    """`mig`: the GPUs in MIG mode. nodeagent hands out whole GPUs: a node whose GPUs are in MIG
    mode does not take part in a job that needs GPUs, and says why (its MIG instances would need
    handing out as devices of their own, health judged per parent: not done yet)."""
    if not available:
        return GpuDecision(None, None, None, False, None)
    usable = tuple(v.index for v in verdicts if not v.drains)
    unfit = (
        f"{len(usable)} usable GPUs of {len(verdicts)}, the job needs {gpus_needed}"
        if len(usable) < gpus_needed
        else None
    )
    if mig and gpus_needed > 0 and unfit is None:
        listed = ", ".join(map(str, mig))
        unfit = (
            f"GPU {listed} in MIG mode: nodeagent hands out whole GPUs only; disable MIG "
            f"(nvidia-smi -i {mig[0]} -mig 0, then reset the GPU) or set job.gpus_per_worker: 0"
        )
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
