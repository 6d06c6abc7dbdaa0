"""FakeNvml: the part of pynvml nodeagent uses, driven by a file, raising NVML's real errors.

For tests, and for users without GPUs who want to rehearse faults (`health.fake_gpus: PATH`).
The file (YAML or JSON) is re-read whenever it changes, so editing it injects a fault into a
running agent:

    init_error: null          # an NVML error code for nvmlInit: 12 no library, 9 no driver
    gpus:
      - uuid: GPU-fake-0
        minor: 0                                # /dev/nvidia0; omit: the GPU's index
        cpus: "0-15,64-79"                      # the CPUs near it (NVML's CPU affinity)
        bus_id: "00000000:3B:00.0"
        name: NVIDIA H100 80GB HBM3
        memory_mib: 81559
        temperature_c: 45
        slowdown_temperature_c: 90
        power_w: 300
        clocks_event_reasons: 0
        sm_clock_mhz: 1980                      # SM clock now, and its most
        sm_clock_max_mhz: 1980
        ecc_uncorrected_volatile: 0
        remapped_rows: [0, 0, false, false]   # correctable, uncorrectable, pending, failure
        retired_pages_pending: false
        pcie_replays: 0
        nvlinks: [1, 1]                         # link states; omit for no NVLink
        recovery_action: 0                      # omit: field not supported (driver < r570)
        mig: [1, 1]                             # MIG mode, current and pending; omit: none
        mig_devices: [{uuid: MIG-fake-0-0, memory_mib: 9856}]   # its instances, with MIG on
        errors: {temperature_c: 3}              # NVML error code per reading; "all": every call
    xids: [{gpu: 0, xid: 79}]                   # each entry is delivered once as an event

Missing readings raise NVML_ERROR_NOT_SUPPORTED, as a real GPU that lacks them does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml
import yaml

from nodeagent.gpu.affinity import mask_of_cpus, parse_cpu_list

NOT_SUPPORTED, INVALID_ARGUMENT, NOT_FOUND, TIMEOUT = 3, 2, 6, 10
MAX_MIG_DEVICES = 7  # an A100's or H100's most instances


@dataclass
class _Handle:
    index: int


@dataclass
class _Pci:
    busId: str


@dataclass
class _Memory:
    total: int  # bytes, as NVML's nvmlMemory_t


@dataclass
class _MigHandle:
    parent: int
    slot: int


@dataclass
class _Value:
    uiVal: int


@dataclass
class _Field:
    nvmlReturn: int
    value: _Value


@dataclass
class _Event:
    device: _Handle
    eventData: int


class FakeNvml:
    """Drop-in for the `pynvml` module in NvmlBackend. Constants and error classes are the
    real ones from nvidia-ml-py."""

    NVMLError = pynvml.NVMLError

    def __init__(self, source: Path | Mapping[str, Any]) -> None:
        self._path = source if isinstance(source, Path) else None
        self._data: Mapping[str, Any] = {} if isinstance(source, Path) else source
        self._mtime = -1.0
        self._delivered = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(pynvml, name)  # NVML_* constants, nvmlEventType*, ...

    def _state(self) -> Mapping[str, Any]:
        if self._path is not None:
            mtime = self._path.stat().st_mtime
            if mtime != self._mtime:
                text = self._path.read_text()
                self._data = (
                    json.loads(text) if self._path.suffix == ".json" else yaml.safe_load(text)
                ) or {}
                self._mtime = mtime
        return self._data

    def _gpu(self, handle: _Handle, reading: str) -> Any:
        gpus = self._state().get("gpus") or []
        if handle.index >= len(gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        gpu = gpus[handle.index]
        errors = gpu.get("errors") or {}
        code = errors.get(reading, errors.get("all"))
        if code is not None:
            raise pynvml.NVMLError(int(code))
        if gpu.get(reading) is None:
            raise pynvml.NVMLError(NOT_SUPPORTED)
        return gpu[reading]

    # -- lifecycle --------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        code = self._state().get("init_error")
        if code is not None:
            raise pynvml.NVMLError(int(code))

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self._state().get("gpus") or [])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        return _Handle(index)

    def nvmlDeviceGetIndex(self, handle: _Handle) -> int:
        return handle.index

    # -- readings ---------------------------------------------------------------------------

    def nvmlDeviceGetUUID(self, h: _Handle | _MigHandle) -> str:
        if isinstance(h, _MigHandle):
            return str(self._mig(h)["uuid"])
        return str(self._gpu(h, "uuid"))

    def nvmlDeviceGetMinorNumber(self, h: _Handle) -> int:
        """/dev/nvidia<minor>: the file's `minor`, else the GPU's index (as on most nodes)."""
        if "minor" in self._raw(h):
            return int(self._gpu(h, "minor"))
        self._gpu(h, "uuid")  # a lost GPU, `errors: {all: ...}`: what NVML would raise
        return h.index

    def nvmlDeviceGetCpuAffinity(self, h: _Handle, words: int) -> list[int]:
        """The mask of the file's `cpus` (a CPU list), in `words` 64-bit words."""
        return mask_of_cpus(parse_cpu_list(str(self._gpu(h, "cpus"))), words)

    def nvmlDeviceGetName(self, h: _Handle) -> str:
        return str(self._gpu(h, "name"))

    def nvmlDeviceGetMemoryInfo(self, h: _Handle | _MigHandle) -> _Memory:
        if isinstance(h, _MigHandle):
            mib = self._mig(h).get("memory_mib")
            if mib is None:
                raise pynvml.NVMLError(NOT_SUPPORTED)
        else:
            mib = self._gpu(h, "memory_mib")
        return _Memory(int(mib) << 20)

    def nvmlDeviceGetMaxMigDeviceCount(self, h: _Handle) -> int:
        self._gpu(h, "mig")  # NOT_SUPPORTED without MIG, as a GPU that has none
        return MAX_MIG_DEVICES

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: _Handle, slot: int) -> _MigHandle:
        devices = self._raw(h).get("mig_devices") or []
        if slot >= len(devices):
            raise pynvml.NVMLError(NOT_FOUND)  # an empty slot, as NVML says of one
        return _MigHandle(h.index, slot)

    def _raw(self, h: _Handle) -> Mapping[str, Any]:
        gpus = self._state().get("gpus") or []
        return gpus[h.index] if h.index < len(gpus) else {}

    def _mig(self, h: _MigHandle) -> Mapping[str, Any]:
        devices = self._gpu(_Handle(h.parent), "mig_devices")
        return dict(devices[h.slot])

    def nvmlDeviceGetPciInfo(self, h: _Handle) -> _Pci:
        return _Pci(str(self._gpu(h, "bus_id")))

    def nvmlDeviceGetTemperature(self, h: _Handle, sensor: int) -> int:
        return int(self._gpu(h, "temperature_c"))

    def nvmlDeviceGetTemperatureThreshold(self, h: _Handle, kind: int) -> int:
        return int(self._gpu(h, "slowdown_temperature_c"))

    def nvmlDeviceGetPowerUsage(self, h: _Handle) -> int:
        return int(float(self._gpu(h, "power_w")) * 1000)  # milliwatts, as NVML

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: _Handle) -> int:
        return int(self._gpu(h, "clocks_event_reasons"))

    def nvmlDeviceGetClockInfo(self, h: _Handle, clock: int) -> int:
        return int(self._gpu(h, "sm_clock_mhz"))

    def nvmlDeviceGetMaxClockInfo(self, h: _Handle, clock: int) -> int:
        return int(self._gpu(h, "sm_clock_max_mhz"))

    def nvmlDeviceGetTotalEccErrors(self, h: _Handle, kind: int, counter: int) -> int:
        return int(self._gpu(h, "ecc_uncorrected_volatile"))

    def nvmlDeviceGetRemappedRows(self, h: _Handle) -> tuple[int, int, int, int]:
        corr, unc, pending, failure = self._gpu(h, "remapped_rows")
        return int(corr), int(unc), int(bool(pending)), int(bool(failure))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: _Handle) -> int:
        return int(bool(self._gpu(h, "retired_pages_pending")))

    def nvmlDeviceGetMigMode(self, h: _Handle) -> tuple[int, int]:
        current, pending = self._gpu(h, "mig")
        return int(current), int(pending)

    def nvmlDeviceGetPcieReplayCounter(self, h: _Handle) -> int:
        return int(self._gpu(h, "pcie_replays"))

    def nvmlDeviceGetNvLinkState(self, h: _Handle, link: int) -> int:
        links = self._gpu(h, "nvlinks")
        if link >= len(links):
            raise pynvml.NVMLError(INVALID_ARGUMENT)
        return int(links[link])

    def nvmlDeviceGetFieldValues(self, h: _Handle, fields: list[int]) -> list[_Field]:
        try:
            action = int(self._gpu(h, "recovery_action"))
        except pynvml.NVMLError as exc:
            if exc.value != NOT_SUPPORTED:
                raise
            return [_Field(NOT_SUPPORTED, _Value(0))]
        return [_Field(0, _Value(action))]

    # -- XID events -------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> object:
        return object()

    def nvmlDeviceGetSupportedEventTypes(self, h: _Handle) -> int:
        return int(pynvml.nvmlEventTypeXidCriticalError)

    def nvmlDeviceRegisterEvents(self, h: _Handle, mask: int, events: object) -> None:
        pass

    def nvmlEventSetWait(self, events: object, timeout_ms: int) -> _Event:
        xids = self._state().get("xids") or []
        if self._delivered < len(xids):
            entry = xids[self._delivered]
            self._delivered += 1
            return _Event(_Handle(int(entry["gpu"])), int(entry["xid"]))
        import time

        time.sleep(min(timeout_ms / 1000, 0.2))  # a short nap: the file is polled, not watched
        raise pynvml.NVMLError(TIMEOUT)
