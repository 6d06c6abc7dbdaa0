"""What a GPU backend reports: plain data, sampled in the background and cached."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class DeviceError(str, Enum):
    """An NVML error that taints a whole device (not a single unsupported reading)."""

    GPU_LOST = "gpu_lost"  # NVML_ERROR_GPU_IS_LOST (15): fell off the bus; reboot the node
    RESET_REQUIRED = "reset_required"  # NVML_ERROR_RESET_REQUIRED (16): reset the GPU
    UNKNOWN = "unknown"  # any other error reading the device


@dataclass(frozen=True)
class MigDevice:
    """A MIG instance of a GPU in MIG mode: a unit of its own, handed out by its UUID."""

    uuid: str
    memory_mib: int | None = None


@dataclass(frozen=True)
class GpuReading:
    """One GPU's state. None means "not supported" or "not read", never "zero"."""

    index: int
    uuid: str = ""
    bus_id: str = ""
    minor: int | None = None  # its device node's, /dev/nvidia<minor> (character major 195)
    cpus: tuple[int, ...] = ()  # the CPUs near it (NVML's CPU affinity); empty: not known
    name: str = ""  # the model, as NVML names it ("NVIDIA H100 80GB HBM3")
    memory_mib: int | None = None
    temperature_c: float | None = None
    slowdown_temperature_c: float | None = None
    power_w: float | None = None
    clocks_event_reasons: int | None = None
    sm_clock_mhz: int | None = None  # now, and the most it may run at: a slow GPU's why
    sm_clock_max_mhz: int | None = None
    ecc_uncorrected_volatile: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    retired_pages_pending: bool | None = None
    pcie_replays: int | None = None
    nvlinks_down: tuple[int, ...] = ()
    recovery_action: int | None = None
    mig: bool | None = None  # MIG mode on (None: not supported, not an Ampere+ data-center GPU)
    mig_devices: tuple[MigDevice, ...] = ()  # its MIG instances, when MIG mode is on
    xids: tuple[int, ...] = ()  # XIDs seen on this GPU since the agent started
    error: DeviceError | None = None
    error_detail: str = ""

    @property
    def units(self) -> tuple[str, ...]:
        """The UUIDs of the units it is: its MIG instances in MIG mode, else itself."""
        return tuple(m.uuid for m in self.mig_devices) if self.mig else (self.uuid,)


@dataclass(frozen=True)
class GpuSnapshot:
    """All GPUs of the node. `available` is False when there is no NVML at all."""

    available: bool
    reason: str = ""  # why unavailable (no driver, no permission, ...)
    gpus: tuple[GpuReading, ...] = field(default=())
