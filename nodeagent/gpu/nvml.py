"""The NVML backend: readings and XID events through nvidia-ml-py (`pynvml`).

`NvmlBackend` takes the NVML module as an argument: the real `pynvml`, or `FakeNvml`, which
implements the same functions from a file and raises NVML's real error types. Errors map as
the brief says: no library, no driver or no permission at init -> GPU monitoring unavailable;
per call, GPU_IS_LOST (15) and RESET_REQUIRED (16) taint the device, NOT_SUPPORTED (3) (or any
other error) skips that one reading.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from typing import Any, TypeVar

from nodeagent.errors import NodeagentError
from nodeagent.gpu.affinity import cpus_of_mask, mask_words
from nodeagent.gpu.readings import DeviceError, GpuReading, MigDevice

log = logging.getLogger(__name__)
T = TypeVar("T")

LIBRARY_NOT_FOUND, DRIVER_NOT_LOADED, NO_PERMISSION = 12, 9, 4
GPU_IS_LOST, RESET_REQUIRED, TIMEOUT = 15, 16, 10
RECOVERY_ACTION_FIELD = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, driver >= r570
XID_CRITICAL = 0x8  # nvmlEventTypeXidCriticalError
MAX_NVLINKS = 18
MIB = 1 << 20


class GpuUnavailable(NodeagentError):
    """No usable NVML on this node: GPU monitoring is off, everything else works."""


class _Tainted(Exception):
    def __init__(self, error: DeviceError, detail: str) -> None:
        super().__init__(detail)
        self.error = error


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def load_pynvml() -> Any:
    """The real pynvml module. Raises GpuUnavailable if nvidia-ml-py is not installed."""
    try:
        import pynvml
    except ImportError as exc:
        raise GpuUnavailable(f"nvidia-ml-py is not installed ({exc})") from exc
    return pynvml


class NvmlBackend:
    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._handles: list[Any] = []
        self._events: Any = None

    def open(self) -> int:
        """Initialize NVML and register for XID events; returns the number of GPUs.

        Raises:
            GpuUnavailable: no library, no driver, no permission (or NVML fails otherwise).
        """
        nvml = self._nvml
        try:
            nvml.nvmlInit()
            self._handles = [
                nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())
            ]
        except nvml.NVMLError as exc:
            meaning = {
                LIBRARY_NOT_FOUND: "no NVIDIA driver library",
                DRIVER_NOT_LOADED: "the NVIDIA driver is not loaded",
                NO_PERMISSION: "no permission to use NVML",
            }.get(exc.value, "NVML failed to start")
            raise GpuUnavailable(f"{meaning} ({type(exc).__name__}: {exc})") from exc
        self._register_xid_events()
        return len(self._handles)

    def _register_xid_events(self) -> None:
        nvml = self._nvml
        try:
            self._events = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            log.warning("no NVML event set, XIDs only from the kernel log: %s", exc)
            return
        for index, handle in enumerate(self._handles):
            try:
                mask = nvml.nvmlDeviceGetSupportedEventTypes(handle) & XID_CRITICAL
                if mask:
                    nvml.nvmlDeviceRegisterEvents(handle, mask, self._events)
            except nvml.NVMLError as exc:
                log.warning("GPU %d: cannot register for XID events: %s", index, exc)

    def close(self) -> None:
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()

    def _get(self, fn: Callable[..., T], *args: Any) -> T | None:
        try:
            return fn(*args)
        except self._nvml.NVMLError as exc:
            if exc.value == GPU_IS_LOST:
                raise _Tainted(DeviceError.GPU_LOST, str(exc)) from exc
            if exc.value == RESET_REQUIRED:
                raise _Tainted(DeviceError.RESET_REQUIRED, str(exc)) from exc
            return None  # NOT_SUPPORTED, or a reading this GPU cannot give now

    def sample(self) -> tuple[GpuReading, ...]:
        return tuple(self._read(index, handle) for index, handle in enumerate(self._handles))

    def _read(self, index: int, handle: Any) -> GpuReading:
        try:
            return self._read_device(index, handle)
        except _Tainted as tainted:
            return GpuReading(index=index, error=tainted.error, error_detail=str(tainted))
        except Exception as exc:  # a wedged or odd device must not stop the sampler
            return GpuReading(index=index, error=DeviceError.UNKNOWN, error_detail=repr(exc))

    def _read_device(self, index: int, h: Any) -> GpuReading:
        nvml, get = self._nvml, self._get
        power_mw = get(nvml.nvmlDeviceGetPowerUsage, h)
        remapped = get(nvml.nvmlDeviceGetRemappedRows, h)
        retired = get(nvml.nvmlDeviceGetRetiredPagesPendingStatus, h)
        pci = get(nvml.nvmlDeviceGetPciInfo, h)
        mig = get(nvml.nvmlDeviceGetMigMode, h)  # (current, pending)
        mig_on = mig is not None and mig[0] == nvml.NVML_DEVICE_MIG_ENABLE
        return GpuReading(
            index=index,
            uuid=_text(get(nvml.nvmlDeviceGetUUID, h) or ""),
            bus_id=_text(pci.busId) if pci is not None else "",
            minor=get(nvml.nvmlDeviceGetMinorNumber, h),
            cpus=self._cpus(h),
            name=_text(get(nvml.nvmlDeviceGetName, h) or ""),
            memory_mib=self._memory_mib(h),
            temperature_c=get(nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU),
            slowdown_temperature_c=get(
                nvml.nvmlDeviceGetTemperatureThreshold, h, nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
            ),
            power_w=power_mw / 1000 if power_mw is not None else None,
            clocks_event_reasons=get(nvml.nvmlDeviceGetCurrentClocksEventReasons, h),
            sm_clock_mhz=get(nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM),
            sm_clock_max_mhz=get(nvml.nvmlDeviceGetMaxClockInfo, h, nvml.NVML_CLOCK_SM),
            ecc_uncorrected_volatile=get(
                nvml.nvmlDeviceGetTotalEccErrors,
                h,
                nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                nvml.NVML_VOLATILE_ECC,
            ),
            remapped_rows_pending=bool(remapped[2]) if remapped is not None else None,
            remapped_rows_failure=bool(remapped[3]) if remapped is not None else None,
            retired_pages_pending=bool(retired) if retired is not None else None,
            pcie_replays=get(nvml.nvmlDeviceGetPcieReplayCounter, h),
            nvlinks_down=self._nvlinks_down(h),
            recovery_action=self._recovery_action(h),
            mig=mig_on if mig is not None else None,
            mig_devices=self._mig_devices(h) if mig_on else (),
        )

    def _cpus(self, handle: Any) -> tuple[int, ...]:
        words = mask_words(os.cpu_count() or 1)
        mask = self._get(self._nvml.nvmlDeviceGetCpuAffinity, handle, words)
        return cpus_of_mask(list(mask)) if mask is not None else ()

    def _memory_mib(self, handle: Any) -> int | None:
        memory = self._get(self._nvml.nvmlDeviceGetMemoryInfo, handle)
        return int(memory.total) // MIB if memory is not None else None

    def _mig_devices(self, handle: Any) -> tuple[MigDevice, ...]:
        """The MIG instances made on a GPU in MIG mode (an empty slot raises NOT_FOUND: none
        there). An instance that cannot be read is left out: it is not offered."""
        nvml, found = self._nvml, []
        for slot in range(self._get(nvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0):
            try:
                instance = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
                uuid = _text(nvml.nvmlDeviceGetUUID(instance))
            except nvml.NVMLError:
                continue
            found.append(MigDevice(uuid, self._memory_mib(instance)))
        return tuple(found)

    def _nvlinks_down(self, handle: Any) -> tuple[int, ...]:
        down = []
        for link in range(MAX_NVLINKS):
            state = self._get(self._nvml.nvmlDeviceGetNvLinkState, handle, link)
            if state is None:
                break  # no such link (or NVLink unsupported)
            if state == 0:
                down.append(link)
        return tuple(down)

    def _recovery_action(self, handle: Any) -> int | None:
        values = self._get(self._nvml.nvmlDeviceGetFieldValues, handle, [RECOVERY_ACTION_FIELD])
        if not values or values[0].nvmlReturn != 0:
            return None
        return int(values[0].value.uiVal)

    def wait_xids(self, timeout_s: float) -> list[tuple[int, int]]:
        """Block up to `timeout_s` for XID events; returns (GPU index, XID) pairs."""
        if self._events is None:
            return []
        nvml = self._nvml
        try:
            data = nvml.nvmlEventSetWait(self._events, int(timeout_s * 1000))
        except nvml.NVMLError as exc:
            if exc.value != TIMEOUT:
                log.debug("XID wait: %s", exc)
            return []
        try:
            index = int(nvml.nvmlDeviceGetIndex(data.device))
        except nvml.NVMLError:
            index = -1
        return [(index, int(data.eventData))]
