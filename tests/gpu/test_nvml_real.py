"""The NVML backend against a real GPU and driver. Run on a GPU machine: pytest -m gpu.

Skipped (by tests/conftest.py) where NVML cannot be opened.
"""

from __future__ import annotations

import getpass
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

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
            if r.sm_clock_mhz is not None and r.sm_clock_max_mhz is not None:  # data-center GPUs
                assert 0 < r.sm_clock_mhz <= r.sm_clock_max_mhz
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


def test_node_health_command_judges_every_gpu(tmp_path: Path) -> None:
    """`nodeagent health --json`, the preflight, against the real NVML: one entry per GPU."""
    backend = NvmlBackend(load_pynvml())
    count = backend.open()
    backend.close()
    config = tmp_path / "config.yaml"
    job = {"id": "preflight", "entrypoint": ["true"], "user": getpass.getuser(), "allow_root": True}
    config.write_text(yaml.safe_dump({"job": job, "health": {"gpu": "on"}}))
    result = subprocess.run(
        [sys.executable, "-m", "nodeagent", "health", "--config", str(config), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    print(result.stdout, result.stderr)
    assert result.returncode in (0, 1), result.stderr
    doc = json.loads(result.stdout)
    assert doc["available"] is True and doc["config_error"] is None
    assert [g["index"] for g in doc["gpus"]] == list(range(count))
    for g in doc["gpus"]:
        assert g["uuid"].startswith("GPU-") and g["bus_id"]
        assert g["health"] in ("healthy", "degraded", "unhealthy") and g["reason"]
        assert g["readings"]["temperature_c"] is not None
    assert (result.returncode == 1) == (doc["cordon"] is not None or doc["unfit"] is not None)
