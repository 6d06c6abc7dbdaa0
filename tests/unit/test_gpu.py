"""GPU health without a GPU: the classifier, kmsg parsing, and the NVML backend run against
FakeNvml, which raises NVML's real error types (pynvml.NVMLError(code))."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pynvml
import pytest
import yaml

from nodeagent.config.load import load_config
from nodeagent.config.settings import HealthConfig
from nodeagent.gpu import kmsg
from nodeagent.gpu.classify import Action, Health, Thresholds, classify
from nodeagent.gpu.fake import FakeNvml
from nodeagent.gpu.health import NodeHealth
from nodeagent.gpu.inventory import offered
from nodeagent.gpu.monitor import GpuMonitor
from nodeagent.gpu.nvml import GpuUnavailable, NvmlBackend, load_pynvml
from nodeagent.gpu.readings import DeviceError, GpuReading, GpuSnapshot, MigDevice
from nodeagent.model.gpus import GpuUnit
from nodeagent.state import JobState
from nodeagent.supervisor.spec import visible_devices_of, worker_specs
from tests.helpers.factories import make_record
from tests.helpers.gpus import FIXTURES, healthy_gpu
from tests.helpers.runas import AS_TESTER

OK = GpuReading(
    index=0,
    temperature_c=50,
    slowdown_temperature_c=90,
    ecc_uncorrected_volatile=0,
    remapped_rows_pending=False,
    remapped_rows_failure=False,
    pcie_replays=0,
    recovery_action=0,
    clocks_event_reasons=0,
)
T = Thresholds()


# -- classifier ------------------------------------------------------------------------------


def test_healthy() -> None:
    verdict = classify(OK, T)
    assert (verdict.health, verdict.action, verdict.reason) == (Health.HEALTHY, Action.NONE, "ok")


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68, 94, 109])
def test_application_xids_restart_workers(xid: int) -> None:
    verdict = classify(replace(OK, xids=(xid,)), T)
    assert verdict.action is Action.RESTART_WORKERS and not verdict.drains
    assert f"XID {xid} (application-level)" in verdict.reason


@pytest.mark.parametrize(
    "xid", [48, 61, 62, 64, 74, 92, 95, 119, 120, 140, 143, 144, 150, 154, 155, 156, 158]
)
def test_node_xids_drain(xid: int) -> None:
    verdict = classify(replace(OK, xids=(xid,)), T)
    assert (
        verdict.health is Health.UNHEALTHY
        and verdict.action is Action.DRAIN_NODE
        and verdict.drains
    )


def test_xid_79_fell_off_the_bus_needs_a_reboot() -> None:
    assert classify(replace(OK, xids=(79,)), T).action is Action.REBOOT_NODE


def test_unclassified_xid_is_only_degraded() -> None:
    verdict = classify(replace(OK, xids=(999,)), T)
    assert (verdict.health, verdict.action) == (Health.DEGRADED, Action.NONE)


@pytest.mark.parametrize(
    ("changes", "thresholds", "health", "action", "words"),
    [
        ({"temperature_c": 91}, T, Health.UNHEALTHY, Action.DRAIN_NODE, "91 C >= limit 90 C"),
        (
            {"temperature_c": 80},
            Thresholds(max_temperature_c=75),
            Health.UNHEALTHY,
            Action.DRAIN_NODE,
            "limit 75",
        ),
        ({"temperature_c": 80}, T, Health.HEALTHY, Action.NONE, "ok"),
        (
            {"ecc_uncorrected_volatile": 1},
            T,
            Health.UNHEALTHY,
            Action.DRAIN_NODE,
            "1 uncorrected ECC",
        ),
        (
            {"ecc_uncorrected_volatile": 1},
            Thresholds(max_ecc_uncorrected=2),
            Health.HEALTHY,
            Action.NONE,
            "ok",
        ),
        (
            {"remapped_rows_pending": True},
            T,
            Health.UNHEALTHY,
            Action.RESET_GPU,
            "remapping pending",
        ),
        (
            {"remapped_rows_failure": True},
            T,
            Health.UNHEALTHY,
            Action.RESET_GPU,
            "remapping failed",
        ),
        ({"retired_pages_pending": True}, T, Health.UNHEALTHY, Action.RESET_GPU, "page retirement"),
        ({"recovery_action": 1}, T, Health.UNHEALTHY, Action.RESET_GPU, "recovery action 1"),
        ({"recovery_action": 2}, T, Health.UNHEALTHY, Action.REBOOT_NODE, "reboot"),
        ({"recovery_action": 3}, T, Health.UNHEALTHY, Action.DRAIN_NODE, "peer-to-peer"),
        ({"recovery_action": 4}, T, Health.UNHEALTHY, Action.RESET_GPU, "reset"),
        ({"recovery_action": 7}, T, Health.UNHEALTHY, Action.REBOOT_NODE, "reboot"),
        ({"clocks_event_reasons": 0x8}, T, Health.DEGRADED, Action.NONE, "HW slowdown"),
        ({"clocks_event_reasons": 0x40}, T, Health.DEGRADED, Action.NONE, "HW thermal slowdown"),
        ({"clocks_event_reasons": 0x80}, T, Health.DEGRADED, Action.NONE, "power brake"),
        ({"nvlinks_down": (2, 5)}, T, Health.UNHEALTHY, Action.DRAIN_NODE, "NVLink down: 2, 5"),
        ({"pcie_replays": 12}, T, Health.DEGRADED, Action.NONE, "12 PCIe replays"),
        (
            {"pcie_replays": 12},
            Thresholds(max_pcie_replays=10),
            Health.UNHEALTHY,
            Action.DRAIN_NODE,
            "max 10",
        ),
        (
            {"error": DeviceError.GPU_LOST},
            T,
            Health.UNHEALTHY,
            Action.REBOOT_NODE,
            "fell off the bus",
        ),
        (
            {"error": DeviceError.RESET_REQUIRED},
            T,
            Health.UNHEALTHY,
            Action.RESET_GPU,
            "requires a reset",
        ),
        (
            {"error": DeviceError.UNKNOWN, "error_detail": "boom"},
            T,
            Health.UNHEALTHY,
            Action.DRAIN_NODE,
            "boom",
        ),
    ],
)
def test_thresholds_and_device_errors(
    changes: dict[str, Any], thresholds: Thresholds, health: Health, action: Action, words: str
) -> None:
    verdict = classify(replace(OK, **changes), thresholds)
    assert (verdict.health, verdict.action) == (health, action)
    assert words in verdict.reason


def test_the_strongest_action_wins_and_every_reason_is_kept() -> None:
    verdict = classify(replace(OK, xids=(13, 79), clocks_event_reasons=0x40), T)
    assert verdict.action is Action.REBOOT_NODE
    assert "XID 13" in verdict.reason and "XID 79" in verdict.reason and "thermal" in verdict.reason


def test_unsupported_readings_are_not_zero() -> None:
    assert classify(GpuReading(index=3), T).health is Health.HEALTHY


# -- kernel log ------------------------------------------------------------------------------


def test_kmsg_fixture() -> None:
    found = kmsg.parse((FIXTURES / "kmsg.txt").read_text().splitlines())
    assert [(x.bus_id, x.xid) for x in found] == [
        ("0000:3b:00", 79),
        ("0000:5e:00", 13),
        ("0000:5e:00", 94),
        ("0001:af:00", 48),
    ]


@pytest.mark.parametrize("bus", ["PCI:0000:3B:00", "00000000:3B:00.0", "0000:3b:00"])
def test_bus_ids_normalize(bus: str) -> None:
    assert kmsg.normalize_bus_id(bus) == "0000:3b:00"


def test_read_kmsg_of_a_file_and_of_nothing(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    path.write_text("a\n")
    assert kmsg.read_kmsg(path) == ["a\n"]
    assert kmsg.read_kmsg(tmp_path / "missing") == []


# -- the NVML backend over FakeNvml ----------------------------------------------------------


def test_backend_reads_every_field() -> None:
    backend = NvmlBackend(FakeNvml({"gpus": [healthy_gpu(recovery_action=1, nvlinks=[1, 0, 1])]}))
    assert backend.open() == 1
    reading = backend.sample()[0]
    assert reading.uuid == "GPU-fake-0" and reading.bus_id == "00000000:3B:00.0"
    assert (reading.temperature_c, reading.slowdown_temperature_c, reading.power_w) == (
        50,
        90,
        300.5,
    )
    assert reading.recovery_action == 1 and reading.nvlinks_down == (1,)
    assert reading.remapped_rows_pending is False and reading.ecc_uncorrected_volatile == 0
    assert (reading.sm_clock_mhz, reading.sm_clock_max_mhz) == (1410, 1980)
    assert reading.minor == 0  # no minor in the file: the GPU's index, /dev/nvidia0


def test_backend_reads_each_gpus_device_minor_and_none_where_nvml_cannot_say() -> None:
    """The device cgroup allows a job's GPUs by their /dev/nvidia<minor>, which need not be
    their index (supervisor/devices.py)."""
    gpus = [
        healthy_gpu(minor=7),
        healthy_gpu(uuid="GPU-fake-1", errors={"minor": pynvml.NVML_ERROR_UNKNOWN}, minor=3),
        healthy_gpu(uuid="GPU-fake-2"),
    ]
    backend = NvmlBackend(FakeNvml({"gpus": gpus}))
    assert backend.open() == 3
    assert [r.minor for r in backend.sample()] == [7, None, 2]


@pytest.mark.parametrize(
    ("code", "meaning"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "no NVIDIA driver library"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "driver is not loaded"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "no permission"),
        (pynvml.NVML_ERROR_UNKNOWN, "NVML failed to start"),
    ],
)
def test_init_errors_mean_unavailable(code: int, meaning: str) -> None:
    with pytest.raises(GpuUnavailable, match=meaning) as err:
        NvmlBackend(FakeNvml({"init_error": code, "gpus": [healthy_gpu()]})).open()
    assert isinstance(err.value.__cause__, pynvml.NVMLError)
    assert type(err.value.__cause__) is type(pynvml.NVMLError(code))  # the real subclass


@pytest.mark.parametrize(
    ("errors", "expect"),
    [
        ({"all": pynvml.NVML_ERROR_GPU_IS_LOST}, DeviceError.GPU_LOST),
        ({"temperature_c": pynvml.NVML_ERROR_GPU_IS_LOST}, DeviceError.GPU_LOST),
        ({"power_w": pynvml.NVML_ERROR_RESET_REQUIRED}, DeviceError.RESET_REQUIRED),
    ],
)
def test_per_call_errors_taint_the_device(errors: dict[str, int], expect: DeviceError) -> None:
    backend = NvmlBackend(FakeNvml({"gpus": [healthy_gpu(errors=errors)]}))
    backend.open()
    reading = backend.sample()[0]
    assert reading.error is expect


def test_not_supported_skips_only_that_reading() -> None:
    gpu = healthy_gpu(errors={"temperature_c": pynvml.NVML_ERROR_NOT_SUPPORTED})
    del gpu["recovery_action"], gpu["nvlinks"]
    backend = NvmlBackend(FakeNvml({"gpus": [gpu]}))
    backend.open()
    reading = backend.sample()[0]
    assert reading.error is None and reading.temperature_c is None and reading.power_w == 300.5
    assert reading.recovery_action is None and reading.nvlinks_down == ()


def test_real_pynvml_without_a_driver_is_unavailable() -> None:
    """On this machine there is no NVIDIA driver: the real library must say so, not crash."""
    if Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has an NVIDIA driver")
    with pytest.raises(GpuUnavailable, match="NVIDIA driver"):
        NvmlBackend(load_pynvml()).open()


# -- the monitor -----------------------------------------------------------------------------


def test_monitor_samples_in_the_background_and_sees_new_xids(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    state = {"gpus": [healthy_gpu(), healthy_gpu(uuid="GPU-fake-1", bus_id="00000000:5E:00.0")]}
    path.write_text(yaml.safe_dump(state))
    kernel = (FIXTURES / "kmsg.txt").read_text().splitlines()
    monitor = GpuMonitor(NvmlBackend(FakeNvml(path)), 0.05, T, kernel_log=lambda: kernel)
    changes: list[int] = []
    monitor.on_change = lambda: changes.append(1)
    try:
        snap = monitor.start()
        assert snap.available and len(snap.gpus) == 2
        verdicts = monitor.verdicts()
        # XIDs from before the start, matched by bus id: 79 on GPU 0 stays in its verdict; 13
        # and 94 on GPU 1 were application-level, over once those workers ended
        assert verdicts[0].action is Action.REBOOT_NODE and verdicts[1].action is Action.NONE
        state["gpus"][1]["temperature_c"] = 95
        state["xids"] = [{"gpu": 1, "xid": 48}]
        time.sleep(0.01)  # a new mtime
        path.write_text(yaml.safe_dump(state))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (1, 48) not in monitor.xids_since(0)[0]:
            time.sleep(0.05)
        verdict = monitor.verdicts()[1]
        assert "XID 48" in verdict.reason and verdict.drains
        assert changes
    finally:
        monitor.stop()


def test_monitor_without_nvml_reports_why() -> None:
    monitor = GpuMonitor(NvmlBackend(FakeNvml({"init_error": 9})), 1.0, T)
    snap = monitor.start()
    assert not snap.available and "driver is not loaded" in snap.reason
    assert monitor.verdicts() == ()


# -- what verdicts mean for the node (pure) --------------------------------------------------

from nodeagent.gpu.policy import GPU_CORDON, decide_gpus, hand_out  # noqa: E402
from nodeagent.model.job import Cordon  # noqa: E402

HEALTHY = [classify(replace(OK, index=i), T) for i in range(4)]


def test_no_monitoring_changes_nothing() -> None:
    decision = decide_gpus(False, [], [], None, [], 8, False)
    assert decision.usable is None and decision.unfit is None and decision.cordon is None


def test_node_level_fault_cordons_and_drains() -> None:
    verdicts = [*HEALTHY[:3], classify(replace(OK, index=3, xids=(79,)), T)]
    decision = decide_gpus(True, verdicts, [(3, 79)], None, [0, 1], 2, False)
    assert (
        decision.cordon is not None and decision.cordon.drain and decision.cordon.by == GPU_CORDON
    )
    assert "GPU 3: XID 79" in decision.cordon.reason and "reboot_node" in decision.cordon.reason
    assert decision.usable == (0, 1, 2) and decision.xid_failure is None
    again = decide_gpus(True, verdicts, [], decision.cordon, [0, 1], 2, False)
    assert again.cordon is None  # already cordoned: not again


def test_application_xid_fails_only_the_workers_that_use_that_gpu() -> None:
    verdicts = [classify(replace(OK, index=i, xids=(13,) if i == 1 else ()), T) for i in range(2)]
    hit = decide_gpus(True, verdicts, [(1, 13)], None, [0, 1], 2, False)
    assert hit.xid_failure == (1, 13) and hit.cordon is None
    assert decide_gpus(True, verdicts, [(1, 13)], None, [0], 2, False).xid_failure is None


def test_too_few_usable_gpus_make_the_node_unfit() -> None:
    verdicts = [*HEALTHY[:3], classify(replace(OK, index=3, temperature_c=99), T)]
    decision = decide_gpus(True, verdicts, [], Cordon("x", GPU_CORDON, True), [], 4, False)
    assert decision.unfit == "3 usable GPUs of 4, the job needs 4"
    assert decide_gpus(True, HEALTHY, [], None, [], 4, False).unfit is None


def test_auto_uncordon_only_lifts_a_gpu_cordon_once_clear() -> None:
    gpu_cordon, ops_cordon = Cordon("XID 48", GPU_CORDON, True), Cordon("maint", "ops", True)
    assert decide_gpus(True, HEALTHY, [], gpu_cordon, [], 4, True).uncordon
    assert not decide_gpus(True, HEALTHY, [], gpu_cordon, [], 4, False).uncordon
    assert not decide_gpus(True, HEALTHY, [], ops_cordon, [], 4, True).uncordon
    sick = [*HEALTHY[:3], classify(replace(OK, index=3, remapped_rows_pending=True), T)]
    assert not decide_gpus(True, sick, [], gpu_cordon, [], 4, True).uncordon


def test_a_worker_never_gets_an_excluded_gpu_whatever_the_pci_order() -> None:
    """The fake NVML's index 0 sits last on the PCI bus, index 1 (over its temperature limit)
    first. By index, CUDA's default order (fastest first) could hand a worker GPU 1; by UUID,
    from the real backend's readings through the real policy, it never does."""
    bus = {0: "00000000:5E:00.0", 1: "00000000:3B:00.0", 2: "00000000:4C:00.0"}
    gpus = [healthy_gpu(uuid=f"GPU-fake-{i}", bus_id=bus[i]) for i in range(3)]
    gpus[1]["temperature_c"] = 95
    backend = NvmlBackend(FakeNvml({"gpus": gpus}))
    assert backend.open() == 3
    readings = backend.sample()
    verdicts = [classify(r, T) for r in readings]
    usable = decide_gpus(True, verdicts, (), None, (), 2, False).usable
    assert usable == (0, 2)
    handed = [visible_devices_of((d,))["CUDA_VISIBLE_DEVICES"] for d in hand_out(usable, readings)]
    assert handed == ["GPU-fake-0", "GPU-fake-2"]


MIG_CONFIG = load_config(
    {
        "node": {"name": "a", "address": "10.0.0.1"},
        "redis": {"url": "redis://10.0.0.9:6379/0"},
        "job": {"id": "mig", "entrypoint": ["python", "t.py"], "nproc_per_node": 2, **AS_TESTER},
    }
)
MIG_RECORD = make_record(JobState.RUNNING, 1, ("a",), nproc_per_node=2)


def test_a_gpu_in_mig_mode_counts_and_is_handed_out_as_its_mig_instances() -> None:
    instances = [{"uuid": "MIG-fake-1-0"}, {"uuid": "MIG-fake-1-1"}]
    gpus = [
        healthy_gpu(uuid="GPU-fake-0", mig=[0, 0]),
        healthy_gpu(uuid="GPU-fake-1", mig=[1, 1], mig_devices=instances),
        healthy_gpu(uuid="GPU-fake-2", mig=[1, 1]),  # MIG on, no instance made yet
    ]
    backend = NvmlBackend(FakeNvml({"gpus": gpus}))
    assert backend.open() == 3
    readings = backend.sample()
    assert [r.mig for r in readings] == [False, True, True]
    plain = NvmlBackend(FakeNvml({"gpus": [healthy_gpu()]}))  # no MIG support: not "off"
    assert plain.open() == 1 and plain.sample()[0].mig is None
    verdicts = [classify(r, T) for r in readings]
    units = {r.index: len(r.mig_devices) for r in readings if r.mig}
    fits = decide_gpus(True, verdicts, (), None, (), 3, False, units)
    assert fits.unfit is None and fits.usable == (0, 1, 2)
    assert hand_out(fits.usable, readings) == (
        (0, "GPU-fake-0"),
        (1, "MIG-fake-1-0"),
        (1, "MIG-fake-1-1"),
    )
    short = decide_gpus(True, verdicts, (), None, (), 4, False, units)
    assert short.unfit == (
        "3 usable GPUs of 3, the job needs 4 (GPU 2 in MIG mode with no MIG instance made: "
        "nvidia-smi mig -i 2 -cgi ... -C, or disable MIG)"
    )
    specs = worker_specs({}, MIG_CONFIG, MIG_RECORD, 0, hand_out(fits.usable, readings))
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in specs] == ["GPU-fake-0", "MIG-fake-1-0"]
    assert [s.gpus for s in specs] == [(0,), (1,)]  # an XID on GPU 1 is its instances' workers'


def test_the_backend_reads_each_gpus_model_and_memory_and_the_mig_instances_made() -> None:
    gpus = [
        healthy_gpu(uuid="GPU-fake-0", name="NVIDIA H100 80GB HBM3", memory_mib=81559),
        healthy_gpu(
            uuid="GPU-fake-1",
            name="NVIDIA A100-SXM4-40GB",
            memory_mib=40960,
            mig=[1, 1],
            mig_devices=[{"uuid": "MIG-fake-1-0", "memory_mib": 9856}, {"uuid": "MIG-fake-1-1"}],
        ),
    ]
    backend = NvmlBackend(FakeNvml({"gpus": gpus}))
    backend.open()
    plain, split = backend.sample()
    assert (plain.name, plain.memory_mib, plain.mig_devices) == ("NVIDIA H100 80GB HBM3", 81559, ())
    assert split.mig_devices == (MigDevice("MIG-fake-1-0", 9856), MigDevice("MIG-fake-1-1", None))


def test_a_node_offers_its_healthy_gpus_and_the_mig_instances_of_those_in_mig_mode() -> None:
    gpus = [
        healthy_gpu(uuid="GPU-fake-0", name="H100", memory_mib=81559),
        healthy_gpu(
            uuid="GPU-fake-1", name="A100", mig=[1, 1], mig_devices=[{"uuid": "MIG-fake-1-0"}]
        ),
        healthy_gpu(uuid="GPU-fake-2", name="H100", ecc_uncorrected_volatile=3),  # drains
        healthy_gpu(uuid="GPU-fake-3", errors={"all": pynvml.NVML_ERROR_GPU_IS_LOST}),
    ]
    backend = NvmlBackend(FakeNvml({"gpus": gpus}))
    backend.open()
    readings = backend.sample()
    snapshot = GpuSnapshot(True, gpus=readings)
    units = offered(snapshot, [classify(r, T) for r in readings])
    assert units == (GpuUnit("GPU-fake-0", "H100", 81559), GpuUnit("MIG-fake-1-0", "A100 MIG"))
    assert offered(GpuSnapshot(False, "no NVML"), []) == ()


def test_each_job_on_a_node_acts_on_each_xid_once_and_only_on_its_own_gpus() -> None:
    """Two jobs sharing a node, one GPU each (their grants): an application XID on job b's GPU
    fails b's rank and is nothing to a; a fault that drains job a's GPU cordons a alone. Each
    reads the monitor's XIDs with a cursor of its own, so neither takes them from the other."""
    gpus = [healthy_gpu(uuid="GPU-fake-0"), healthy_gpu(uuid="GPU-fake-1")]
    monitor = GpuMonitor(NvmlBackend(FakeNvml({"gpus": gpus})), 60.0, T, kernel_log=list)
    monitor.start()
    try:
        a = NodeHealth("n", HealthConfig(), 1, monitor, grant=("GPU-fake-0",))
        b = NodeHealth("n", HealthConfig(), 1, monitor, grant=("GPU-fake-1",))
        monitor._record_xid(1, 43)
        assert a.check(None, {0: (0,)}).fail_rank is None
        assert b.check(None, {0: (1,)}).fail_rank == (0, 43)
        assert (a.usable, b.usable) == (((0, "GPU-fake-0"),), ((1, "GPU-fake-1"),))
        monitor._record_xid(0, 79)  # fell off the bus: drains GPU 0, job a's
        monitor.sample()
        assert a.check(None, {0: (0,)}).cordon is not None
        assert b.check(None, {0: (1,)}).cordon is None and b.usable == ((1, "GPU-fake-1"),)
    finally:
        monitor.stop()
