"""gpu/probe.py: one reading with the XIDs already known, against FakeNvml and a fake kernel
log (the fixture the monitor's test reads), and no thread left behind."""

from __future__ import annotations

import threading

from nodeagent.gpu.classify import Action, Thresholds, classify
from nodeagent.gpu.fake import FakeNvml
from nodeagent.gpu.nvml import NvmlBackend
from nodeagent.gpu.probe import probe
from tests.helpers.gpus import FIXTURES, healthy_gpu

KERNEL = (FIXTURES / "kmsg.txt").read_text().splitlines()
SECOND = {"uuid": "GPU-fake-1", "bus_id": "00000000:5E:00.0"}


def test_kernel_log_xids_count_application_ones_do_not() -> None:
    nvml = FakeNvml({"gpus": [healthy_gpu(), healthy_gpu(**SECOND)]})
    before = set(threading.enumerate())  # threads of earlier tests may end meanwhile
    snap = probe(NvmlBackend(nvml), kernel_log=lambda: KERNEL)
    assert set(threading.enumerate()) - before == set()  # it started none that lives on
    assert snap.available and [r.uuid for r in snap.gpus] == ["GPU-fake-0", "GPU-fake-1"]
    # 79 on GPU 0 (bus 3b); 13 and 94 on GPU 1 (bus 5e) only failed those workers
    assert [r.xids for r in snap.gpus] == [(79,), ()]
    verdicts = [classify(r, Thresholds()) for r in snap.gpus]
    assert [v.action for v in verdicts] == [Action.REBOOT_NODE, Action.NONE]


def test_pending_xid_events_are_taken_without_waiting() -> None:
    xids = [{"gpu": 1, "xid": 48}, {"gpu": 0, "xid": 43}, {"gpu": 1, "xid": 999}]
    nvml = FakeNvml({"gpus": [healthy_gpu(), healthy_gpu(**SECOND)], "xids": xids})
    snap = probe(NvmlBackend(nvml), kernel_log=list)
    assert [r.xids for r in snap.gpus] == [(), (48, 999)]


def test_no_nvml_is_unavailable_with_the_reason() -> None:
    snap = probe(NvmlBackend(FakeNvml({"init_error": 12})), kernel_log=list)
    assert not snap.available and "no NVIDIA driver library" in snap.reason and not snap.gpus


def test_the_backend_is_closed_after_a_reading() -> None:
    class Closing(FakeNvml):
        closed = 0

        def nvmlShutdown(self) -> None:
            Closing.closed += 1

    probe(NvmlBackend(Closing({"gpus": [healthy_gpu()]})), kernel_log=list)
    assert Closing.closed == 1
