"""The NVML backend against a real GPU and driver. Run on a GPU machine: pytest -m gpu.

Skipped (by tests/conftest.py) where NVML cannot be opened.
"""

from __future__ import annotations

import pytest

from nodeagent.gpu.classify import Thresholds, classify
from nodeagent.gpu.monitor import GpuMonitor
from nodeagent.gpu.nvml import NvmlBackend, load_pynvml

pytestmark = pytest.mark.gpu


def test_every_gpu_is_read() -> None:
    backend = NvmlBackend(load_pynvml())
    count = backend.open()
    try:
        assert count >= 1
        readings = backend.sample()
        assert len(readings) == count
        for r in readings:
            assert r.error is None, r.error_detail
            assert r.uuid.startswith("GPU-") and r.bus_id
            assert r.temperature_c is not None and 0 < r.temperature_c < 120
            assert r.power_w is None or r.power_w > 0
            assert r.slowdown_temperature_c is None or r.slowdown_temperature_c > r.temperature_c
            print(r, classify(r, Thresholds()))
    finally:
        backend.close()


def test_xid_wait_returns_quietly() -> None:
    backend = NvmlBackend(load_pynvml())
    backend.open()
    try:
        assert backend.wait_xids(0.2) == []  # a lent, healthy GPU raises no XID
    finally:
        backend.close()


def test_monitor_serves_cached_verdicts() -> None:
    monitor = GpuMonitor(NvmlBackend(load_pynvml()), 0.5, Thresholds())
    try:
        snap = monitor.start()
        assert snap.available and snap.gpus
        assert len(monitor.verdicts()) == len(snap.gpus)
    finally:
        monitor.stop()
