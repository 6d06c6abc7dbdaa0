"""The agent's view of its GPUs: owns the monitor, turns verdicts into what the agent does.

`NodeHealth.check()` returns plain instructions (a cordon to set or lift, a rank to fail for an
application XID, events to append); the agent executes them, as it does node and leader
decisions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nodeagent.config.settings import HealthConfig
from nodeagent.errors import ConfigError
from nodeagent.gpu.classify import Thresholds, Verdict
from nodeagent.gpu.monitor import GpuMonitor
from nodeagent.gpu.nvml import GpuUnavailable, NvmlBackend, load_pynvml
from nodeagent.gpu.policy import GPU_CORDON, Device, decide_gpus, hand_out
from nodeagent.model.job import Cordon, Event, GpuInfo, GpuSummary


def build_monitor(health: HealthConfig) -> GpuMonitor:
    """The monitor the config asks for (not started). `gpu: off` gives one that reports off."""
    thresholds = Thresholds(
        max_temperature_c=health.max_temperature_c,
        max_ecc_uncorrected=health.max_ecc_uncorrected,
        max_pcie_replays=health.max_pcie_replays,
    )
    if health.gpu == "off":
        return GpuMonitor(None, health.interval, thresholds, unavailable_reason="health.gpu is off")
    if health.fake_gpus:
        from nodeagent.gpu.fake import FakeNvml

        return GpuMonitor(
            NvmlBackend(FakeNvml(Path(health.fake_gpus))), health.interval, thresholds
        )
    try:
        nvml = load_pynvml()
    except GpuUnavailable as exc:
        return GpuMonitor(None, health.interval, thresholds, unavailable_reason=str(exc))
    return GpuMonitor(NvmlBackend(nvml), health.interval, thresholds)


def start_monitor(monitor: GpuMonitor, health: HealthConfig) -> None:
    """Start sampling. Raises ConfigError when `gpu: on` and there is no usable NVML."""
    snapshot = monitor.start()
    if health.gpu == "on" and not snapshot.available:
        raise ConfigError(
            "health.gpu", f"'on', but GPU monitoring is unavailable: {snapshot.reason}"
        )


@dataclass
class HealthCheck:
    cordon: Cordon | None = None
    uncordon: bool = False
    fail_rank: tuple[int, int] | None = None  # (local rank, XID) to fail
    events: list[Event] = field(default_factory=list)


class NodeHealth:
    def __init__(
        self,
        node: str,
        health: HealthConfig,
        gpus_needed: int,
        monitor: GpuMonitor,
        grant: tuple[str, ...] | None = None,
        per_worker: int = 1,
    ) -> None:
        """`gpus_needed`: what this node's part of the job takes (nproc_per_node x
        gpus_per_worker, `per_worker`); with fewer usable GPUs the node is unfit. `grant`: the
        UUIDs of the GPUs (or MIG instances) the job was given on a node it shares (None: the
        whole node): it uses only those, and only their faults are its (another job's GPU
        failing is that job's)."""
        self._node = node
        self._health = health
        self._needed = gpus_needed
        self._per_worker = per_worker
        self._grant = grant
        self.monitor = monitor
        self._xids = monitor.xid_cursor()  # XIDs from its start on, each job its own cursor
        self.usable: tuple[Device, ...] | None = None  # in hand-out order; None: not monitored
        self.unfit: str | None = None
        self.in_use: tuple[int, ...] = ()  # the running workers' GPUs, at the last check
        self._last: dict[int, tuple[str, str]] = {}

    def check(
        self, cordon: Cordon | None, gpus_by_rank: Mapping[int, Sequence[int]]
    ) -> HealthCheck:
        """Decide from the cached verdicts; `gpus_by_rank` are the running workers' GPUs."""
        snapshot = self.monitor.snapshot()
        verdicts = self.monitor.verdicts()
        xids, self._xids = self.monitor.xids_since(self._xids)
        grant = self._grant
        if grant is not None:  # its GPUs only (a MIG instance's: its GPU's): others' are theirs
            mine = {
                g.index
                for g in snapshot.gpus
                if g.uuid in grant or any(m.uuid in grant for m in g.mig_devices)
            }
            verdicts = tuple(v for v in verdicts if v.index in mine)
            xids = [(gpu, xid) for gpu, xid in xids if gpu in mine]
        in_use = [gpu for gpus in gpus_by_rank.values() for gpu in gpus]
        self.in_use = tuple(in_use)
        decision = decide_gpus(
            snapshot.available,
            verdicts,
            xids,
            cordon,
            in_use,
            self._needed if self._health.gpu != "off" else 0,
            self._health.auto_uncordon,
            units={g.index: len(g.mig_devices) for g in snapshot.gpus if g.mig},
        )
        self.usable, self.unfit = None, decision.unfit
        if decision.usable is not None:
            devices = hand_out(decision.usable, snapshot.gpus)
            if grant is not None:  # a MIG GPU shared: only the instances given
                devices = tuple(d for d in devices if d[1] in grant)
            self.usable = devices
            mig = any(uuid.startswith("MIG-") for _, uuid in devices)
            if mig and self._per_worker > 1 and self._health.gpu != "off":
                self.unfit = (
                    "MIG instances are handed out one a worker (a CUDA process uses one): "
                    f"set job.gpus_per_worker: 1, not {self._per_worker}"
                )
        check = HealthCheck(
            cordon=decision.cordon, uncordon=decision.uncordon, events=self._changes(verdicts)
        )
        if decision.xid_failure is not None:
            gpu, xid = decision.xid_failure
            rank = next(r for r, gpus in gpus_by_rank.items() if gpu in gpus)
            check.fail_rank = (rank, xid)
            check.events.append(
                Event(
                    "gpu_xid",
                    node=self._node,
                    message=f"XID {xid} on GPU {gpu}",
                    data={"gpu": gpu, "xid": xid, "local_rank": rank},
                )
            )
        return check

    def _changes(self, verdicts: Sequence[Verdict]) -> list[Event]:
        events = []
        for v in verdicts:
            now = (v.health.value, v.reason)
            if self._last.get(v.index, ("healthy", "ok")) != now:
                events.append(
                    Event(
                        "gpu_health",
                        node=self._node,
                        message=f"GPU {v.index} {v.health.value}: {v.reason}",
                        data={
                            "gpu": v.index,
                            "health": v.health.value,
                            "action": v.action.value,
                            "reason": v.reason,
                        },
                    )
                )
            self._last[v.index] = now
        return events

    def uncordoned(self, cordon_before: Cordon | None) -> None:
        """An operator lifted the cordon: the XIDs behind it count as dealt with."""
        if cordon_before is not None and cordon_before.by == GPU_CORDON:
            self.monitor.clear_xids()

    def summary(self) -> GpuSummary:
        """The verdicts with each GPU's readings (temperature, power, clocks)."""
        return gpu_summary(self.monitor, readings=True)


def verdicts_only(monitor: GpuMonitor) -> GpuSummary:
    """The node's GPU verdicts without their readings: what its pool heartbeat carries (the
    readings change at every sample, and a report that changes is read again by the pool
    leader: docs/gpu.md)."""
    return gpu_summary(monitor, readings=False)


def gpu_summary(monitor: GpuMonitor, readings: bool) -> GpuSummary:
    """The monitor's verdicts, each with its GPU's last readings or without them."""
    snapshot = monitor.snapshot()
    read = {r.index: r for r in snapshot.gpus} if readings else {}

    def info(v: Verdict) -> GpuInfo:
        r = read.get(v.index)
        if r is None:
            return GpuInfo(v.index, v.health.value, v.action.value, v.reason)
        return GpuInfo(
            v.index,
            v.health.value,
            v.action.value,
            v.reason,
            r.temperature_c,
            r.power_w,
            r.sm_clock_mhz,
            r.sm_clock_max_mhz,
        )

    return GpuSummary(
        available=snapshot.available,
        reason=snapshot.reason,
        gpus=tuple(info(v) for v in monitor.verdicts()),
    )
