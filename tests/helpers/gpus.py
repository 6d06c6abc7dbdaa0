"""GPU readings for the fake NVML backend (nodeagent.gpu.fake): one healthy GPU, the fixtures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def healthy_gpu(**changes: Any) -> dict[str, Any]:
    gpu = {
        "uuid": "GPU-fake-0",
        "bus_id": "00000000:3B:00.0",
        "temperature_c": 50,
        "slowdown_temperature_c": 90,
        "power_w": 300.5,
        "clocks_event_reasons": 0,
        "sm_clock_mhz": 1410,
        "sm_clock_max_mhz": 1980,
        "ecc_uncorrected_volatile": 0,
        "remapped_rows": [0, 0, False, False],
        "retired_pages_pending": False,
        "pcie_replays": 0,
        "nvlinks": [1, 1],
        "recovery_action": 0,
    }
    gpu.update(changes)
    return gpu


def gpu(index: int) -> dict[str, Any]:
    return {
        "uuid": f"GPU-fake-{index}",
        "bus_id": f"00000000:{0x3B + index:02X}:00.0",
        "temperature_c": 45,
        "slowdown_temperature_c": 90,
        "power_w": 250,
        "clocks_event_reasons": 0,
        "ecc_uncorrected_volatile": 0,
        "remapped_rows": [0, 0, False, False],
        "recovery_action": 0,
    }
