"""What a node offers the pool of its GPUs: pure, from the monitor's last reading and verdicts.

Each GPU that reads cleanly and whose verdict does not drain it is a unit, by its UUID; a GPU in
MIG mode offers its MIG instances instead, each by its own UUID (model/gpus.py). A GPU that
fails stops being offered at the next pool heartbeat, so the scheduler places nothing new on it.
"""

from __future__ import annotations

from collections.abc import Sequence

from nodeagent.gpu.classify import Verdict
from nodeagent.gpu.readings import GpuSnapshot
from nodeagent.model.gpus import MAX_UNITS, UUID_RE, GpuUnit


def offered(snapshot: GpuSnapshot, verdicts: Sequence[Verdict]) -> tuple[GpuUnit, ...]:
    if not snapshot.available:
        return ()
    draining = {v.index for v in verdicts if v.drains}
    units: list[GpuUnit] = []
    for gpu in snapshot.gpus:
        if gpu.error is not None or gpu.index in draining:
            continue
        if gpu.mig:
            model = f"{gpu.name[:92]} MIG" if gpu.name else "MIG instance"
            units += [GpuUnit(m.uuid, model, m.memory_mib) for m in gpu.mig_devices]
        else:
            units.append(GpuUnit(gpu.uuid, gpu.name[:96], gpu.memory_mib))
    # what NVML said is checked as the pool's reader checks it: an odd UUID is not offered
    return tuple(u for u in units if UUID_RE.match(u.uuid))[:MAX_UNITS]
