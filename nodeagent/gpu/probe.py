"""One fresh reading of the node's GPUs, for a preflight (`nodeagent health`): no threads.

The agent's GpuMonitor keeps sampling in the background and waits for XID events; a preflight
opens NVML, samples every GPU once, takes the XID events already pending and the XIDs in the
kernel log (as the monitor does at start), and closes NVML again. XIDs that only fail a job's
workers (application-level) say nothing about the GPU and are left out, as the monitor does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from nodeagent.gpu import kmsg
from nodeagent.gpu.classify import APPLICATION_XIDS
from nodeagent.gpu.nvml import GpuUnavailable, NvmlBackend
from nodeagent.gpu.readings import GpuReading, GpuSnapshot

MAX_PENDING_XIDS = 1000  # a bound on events drained at once; a real node has a handful


def probe(
    backend: NvmlBackend, kernel_log: Callable[[], list[str]] = kmsg.read_kmsg
) -> GpuSnapshot:
    """Open the backend, read each GPU once with the XIDs already known, close it.

    Returns an unavailable snapshot (with the reason) when NVML cannot be opened.
    """
    try:
        backend.open()
    except GpuUnavailable as exc:
        return GpuSnapshot(available=False, reason=str(exc))
    try:
        readings = backend.sample()
        xids = _pending_xids(backend) + _kernel_xids(readings, kernel_log())
    finally:
        backend.close()
    by_gpu: dict[int, list[int]] = {}
    for index, xid in xids:
        if xid not in APPLICATION_XIDS:
            by_gpu.setdefault(index, []).append(xid)
    return GpuSnapshot(
        available=True,
        gpus=tuple(replace(r, xids=tuple(by_gpu.get(r.index, ()))) for r in readings),
    )


def _pending_xids(backend: NvmlBackend) -> list[tuple[int, int]]:
    """XID events NVML holds now, without waiting for more."""
    found: list[tuple[int, int]] = []
    while len(found) < MAX_PENDING_XIDS:
        events = backend.wait_xids(0)
        if not events:
            break
        found.extend(events)
    return found


def _kernel_xids(readings: tuple[GpuReading, ...], lines: list[str]) -> list[tuple[int, int]]:
    """(GPU index, XID) for the kernel log's XIDs on these GPUs (matched by PCI bus ID)."""
    by_bus = {kmsg.normalize_bus_id(r.bus_id): r.index for r in readings if r.bus_id}
    return [(by_bus[x.bus_id], x.xid) for x in kmsg.parse(lines) if x.bus_id in by_bus]
