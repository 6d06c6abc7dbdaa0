"""Readings -> a verdict per GPU, as a pure function of (reading, thresholds).

XID classes follow NVIDIA's XID catalogue (see the project brief): application-level XIDs
restart the job (the node is fine); node-level ones take the node out of the job until an
operator (or `auto_uncordon`) brings it back.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from nodeagent.gpu.readings import DeviceError, GpuReading

APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 94, 109})  # 94: contained ECC, restart the app
NODE_XIDS = frozenset(
    {48, 61, 62, 64, 74, 79, 92, 95, 119, 120, 140, 143, *range(144, 151), 154, 155, 156, 158}
)
HW_SLOWDOWN, HW_THERMAL_SLOWDOWN, HW_POWER_BRAKE = 0x8, 0x40, 0x80
RECOVERY_NONE, RECOVERY_GPU_RESET, RECOVERY_NODE_REBOOT = 0, 1, 2
RECOVERY_DRAIN_P2P, RECOVERY_DRAIN_AND_RESET = 3, 4


class Health(str, Enum):
    HEALTHY = "healthy"
    DEGRADED = "degraded"  # works, but slower or closer to failing; no action
    UNHEALTHY = "unhealthy"


class Action(str, Enum):
    """What to do, mildest first; a node's action is the strongest of its GPUs'."""

    NONE = "none"
    RESTART_WORKERS = "restart_workers"  # application-level fault: re-form the job
    DRAIN_NODE = "drain_node"
    RESET_GPU = "reset_gpu"  # drain, then an operator resets the GPU
    REBOOT_NODE = "reboot_node"  # drain, then an operator reboots


ORDER = list(Action)


@dataclass(frozen=True)
class Thresholds:
    max_temperature_c: float | None = None  # None: the GPU's own slowdown threshold
    max_ecc_uncorrected: int = 0  # volatile uncorrected ECC errors tolerated
    max_pcie_replays: int | None = None  # None: replays only count as degraded


@dataclass(frozen=True)
class Verdict:
    index: int
    health: Health
    action: Action
    reason: str

    @property
    def drains(self) -> bool:
        return ORDER.index(self.action) >= ORDER.index(Action.DRAIN_NODE)


def _worst(findings: Iterable[tuple[Health, Action, str]]) -> tuple[Health, Action, str]:
    findings = list(findings)
    if not findings:
        return Health.HEALTHY, Action.NONE, "ok"
    health_rank = [Health.HEALTHY, Health.DEGRADED, Health.UNHEALTHY]
    worst = max(findings, key=lambda f: (ORDER.index(f[1]), health_rank.index(f[0])))
    reasons = "; ".join(f[2] for f in findings)
    return worst[0], worst[1], reasons


def _findings(r: GpuReading, t: Thresholds) -> Iterable[tuple[Health, Action, str]]:
    bad, degraded = Health.UNHEALTHY, Health.DEGRADED
    if r.error is DeviceError.GPU_LOST:
        yield bad, Action.REBOOT_NODE, f"GPU is lost (fell off the bus) {r.error_detail}".strip()
    elif r.error is DeviceError.RESET_REQUIRED:
        yield bad, Action.RESET_GPU, "GPU requires a reset"
    elif r.error is DeviceError.UNKNOWN:
        yield bad, Action.DRAIN_NODE, f"GPU cannot be read: {r.error_detail}"
    for xid in r.xids:
        if xid in NODE_XIDS:
            action = Action.REBOOT_NODE if xid == 79 else Action.DRAIN_NODE
            yield bad, action, f"XID {xid} (node-level)"
        elif xid in APPLICATION_XIDS:
            yield bad, Action.RESTART_WORKERS, f"XID {xid} (application-level)"
        else:
            yield degraded, Action.NONE, f"XID {xid} (unclassified)"
    if (
        r.ecc_uncorrected_volatile is not None
        and r.ecc_uncorrected_volatile > t.max_ecc_uncorrected
    ):
        yield (
            bad,
            Action.DRAIN_NODE,
            (f"{r.ecc_uncorrected_volatile} uncorrected ECC errors (max {t.max_ecc_uncorrected})"),
        )
    if r.remapped_rows_failure:
        yield bad, Action.RESET_GPU, "row remapping failed"
    elif r.remapped_rows_pending:
        yield bad, Action.RESET_GPU, "row remapping pending: reset the GPU to apply it"
    if r.retired_pages_pending:
        yield bad, Action.RESET_GPU, "page retirement pending"
    if r.recovery_action in (RECOVERY_GPU_RESET, RECOVERY_DRAIN_AND_RESET):
        yield (
            bad,
            Action.RESET_GPU,
            f"driver asks for a GPU reset (recovery action {r.recovery_action})",
        )
    elif (
        r.recovery_action == RECOVERY_NODE_REBOOT
        or (r.recovery_action or 0) > RECOVERY_DRAIN_AND_RESET
    ):
        yield (
            bad,
            Action.REBOOT_NODE,
            f"driver asks for a reboot (recovery action {r.recovery_action})",
        )
    elif r.recovery_action == RECOVERY_DRAIN_P2P:
        yield bad, Action.DRAIN_NODE, "driver asks to drain peer-to-peer traffic"
    limit = t.max_temperature_c if t.max_temperature_c is not None else r.slowdown_temperature_c
    if r.temperature_c is not None and limit is not None and r.temperature_c >= limit:
        yield bad, Action.DRAIN_NODE, f"{r.temperature_c:.0f} C >= limit {limit:.0f} C"
    reasons = r.clocks_event_reasons or 0
    for bit, name in (
        (HW_SLOWDOWN, "HW slowdown"),
        (HW_THERMAL_SLOWDOWN, "HW thermal slowdown"),
        (HW_POWER_BRAKE, "power brake"),
    ):
        if reasons & bit:
            yield degraded, Action.NONE, f"clocks limited: {name}"
    if r.nvlinks_down:
        yield bad, Action.DRAIN_NODE, f"NVLink down: {', '.join(map(str, r.nvlinks_down))}"
    if r.pcie_replays:
        if t.max_pcie_replays is not None and r.pcie_replays > t.max_pcie_replays:
            yield (
                bad,
                Action.DRAIN_NODE,
                f"{r.pcie_replays} PCIe replays (max {t.max_pcie_replays})",
            )
        else:
            yield degraded, Action.NONE, f"{r.pcie_replays} PCIe replays"


def classify(reading: GpuReading, thresholds: Thresholds) -> Verdict:
    """One GPU's verdict: health, the strongest suggested action, and every reason. Pure."""
    health, action, reason = _worst(_findings(reading, thresholds))
    return Verdict(reading.index, health, action, reason)
