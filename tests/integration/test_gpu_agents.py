"""GPU health with several real agents, each with its own fake GPUs (FakeNvml files).

Injecting a fault is editing a node's file, as a user rehearsing without GPUs would.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.cluster import LocalCluster, RedisServer
from tests.helpers.gpus import gpu

TIMING = {"heartbeat_interval": "250ms", "lease_ttl": "1500ms"}


class FakeGpus:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, node: str) -> Path:
        return self.directory / f"gpus-{node}.yaml"

    def write(self, node: str, state: dict[str, Any]) -> None:
        time.sleep(0.02)  # a new mtime, so FakeNvml rereads it
        self.path(node).write_text(yaml.safe_dump(state))

    def xid(self, node: str, gpu_index: int, xid: int) -> None:
        state = yaml.safe_load(self.path(node).read_text())
        state.setdefault("xids", []).append({"gpu": gpu_index, "xid": xid})
        self.write(node, state)


@pytest.fixture
def gpu_cluster(
    redis_server: RedisServer, job_id: str, tmp_path: Path
) -> Iterator[tuple[LocalCluster, FakeGpus]]:
    fakes = FakeGpus(tmp_path)
    for node in "abcd":
        fakes.write(node, {"gpus": [gpu(0), gpu(1)]})

    class GpuCluster(LocalCluster):
        def config(self, name: str) -> dict[str, Any]:
            data = super().config(name)
            data["health"] = {"gpu": "on", "interval": "100ms", "fake_gpus": str(fakes.path(name))}
            return data

    cluster = GpuCluster(
        redis_server.url, tmp_path, job=job_id, nproc=2, max_nodes=3, timing=TIMING
    )
    try:
        yield cluster, fakes
    finally:
        cluster.stop()


def nodes_of(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n["name"]: n for n in doc["nodes"]}


def test_each_worker_gets_its_own_healthy_gpu(gpu_cluster: tuple[LocalCluster, FakeGpus]) -> None:
    cluster, _ = gpu_cluster
    cluster.start("a", "b")
    doc = cluster.wait_running(4)
    starts = cluster.starts(doc["generation"])
    assert sorted((s["node"], s["rank"] % 2, s["cuda"]) for s in starts) == [
        ("a", 0, "GPU-fake-0"),  # by UUID: the GPU judged healthy whatever CUDA's order
        ("a", 1, "GPU-fake-1"),
        ("b", 0, "GPU-fake-0"),
        ("b", 1, "GPU-fake-1"),
    ]
    assert {s["cuda_order"] for s in starts} == {"PCI_BUS_ID"}
    health = cluster.ctl("health", "--node", "a")
    assert health.returncode == 0 and "GPU 0: healthy" in health.stdout and "45C" in health.stdout


def test_fatal_xid_drains_the_node_and_uncordon_brings_it_back(
    gpu_cluster: tuple[LocalCluster, FakeGpus],
) -> None:
    cluster, fakes = gpu_cluster
    cluster.start("a", "b", "c")
    before = cluster.wait_running(6)
    fakes.xid("b", 1, 79)  # GPU 1 of node b falls off the bus
    after = cluster.wait_running(4, after_generation=before["generation"])
    assert after["restart_count"] == 0  # draining does not consume restarts
    assert after["reason"] == "gpu_fault"
    b = nodes_of(after)["b"]
    assert (
        b["state"] == "cordoned"
        and b["cordon"]["by"] == "gpu"
        and "XID 79" in b["cordon"]["reason"]
    )
    assert any(e["type"] == "node_drained" and e["node"] == "b" for e in cluster.events())
    assert any(r["event"] == "stop" and r["node"] == "b" for r in cluster.records())  # SIGTERM'd
    health = cluster.ctl("health", "--node", "b", "--json")
    assert '"reboot_node"' in health.stdout and json.loads(health.stdout)["version"] == 1
    assert cluster.ctl("uncordon", "b").returncode == 0
    back = cluster.wait_running(6, after_generation=after["generation"])
    assert nodes_of(back)["b"]["cordon"] is None and back["restart_count"] == 0


def test_application_xid_restarts_the_job_like_a_crash(
    gpu_cluster: tuple[LocalCluster, FakeGpus],
) -> None:
    cluster, fakes = gpu_cluster
    cluster.start("a", "b")
    before = cluster.wait_running(4)
    fakes.xid("a", 0, 13)
    after = cluster.wait_running(4, after_generation=before["generation"])
    assert after["restart_count"] == 1 and "application XID 13" in after["detail"]
    assert nodes_of(after)["a"]["cordon"] is None
    assert any(e["type"] == "gpu_xid" and e["node"] == "a" for e in cluster.events())


def test_a_node_with_too_few_usable_gpus_stays_out(
    gpu_cluster: tuple[LocalCluster, FakeGpus],
) -> None:
    cluster, fakes = gpu_cluster
    hot = gpu(1) | {"temperature_c": 95}
    fakes.write("c", {"gpus": [gpu(0), hot]})
    cluster.start("a", "b", "c")
    doc = cluster.wait_running(4)
    c = nodes_of(doc)["c"]
    assert c["state"] == "cordoned" and c["unfit"] == "1 usable GPUs of 2, the job needs 2"
    assert sorted(doc["members"]) == ["a", "b"]  # (in the order they joined)


def test_a_mig_node_takes_part_with_its_mig_instances_once_they_are_made(
    gpu_cluster: tuple[LocalCluster, FakeGpus],
) -> None:
    """Node c's GPUs are in MIG mode with no instance made: it stays out, saying why. Once
    GPU 0 has two instances, c takes part, each worker on a MIG instance by its UUID."""
    cluster, fakes = gpu_cluster
    fakes.write("c", {"gpus": [gpu(0) | {"mig": [1, 1]}, gpu(1) | {"mig": [1, 1]}]})
    cluster.start("a", "b", "c")
    doc = cluster.wait_running(4)
    c = nodes_of(doc)["c"]
    assert c["state"] == "cordoned" and "GPU 0, 1 in MIG mode with no MIG instance" in c["unfit"]
    assert sorted(doc["members"]) == ["a", "b"]
    made = [{"uuid": "MIG-fake-c-0"}, {"uuid": "MIG-fake-c-1"}]
    fakes.write("c", {"gpus": [gpu(0) | {"mig": [1, 1], "mig_devices": made}, gpu(1)]})
    grown = cluster.wait_running(6, after_generation=doc["generation"])
    on_c = sorted(s["cuda"] for s in cluster.starts(grown["generation"]) if s["node"] == "c")
    assert on_c == ["MIG-fake-c-0", "MIG-fake-c-1"]


def test_operator_drain_waits_for_the_workers(gpu_cluster: tuple[LocalCluster, FakeGpus]) -> None:
    cluster, _ = gpu_cluster
    cluster.start("a", "b", "c")
    before = cluster.wait_running(6)
    drained = cluster.ctl("drain", "c", "--wait", "--timeout", "30s", "--reason", "upgrade")
    assert drained.returncode == 0, drained.stderr
    now = cluster.status()  # the job went on without c before --wait returned
    assert now["state"] == "running" and now["generation"] > before["generation"], now
    assert "c" not in now["members"]
    after = cluster.wait_running(4, after_generation=before["generation"])
    assert after["reason"] == "operator" and after["restart_count"] == 0
    c = nodes_of(after)["c"]
    assert c["cordon"]["reason"] == "upgrade" and not any(
        w["state"] == "running" for w in c["workers"]
    )


def test_auto_uncordon_once_the_condition_clears(
    redis_server: RedisServer, job_id: str, tmp_path: Path
) -> None:
    fakes = FakeGpus(tmp_path)
    for node in "ab":
        fakes.write(node, {"gpus": [gpu(0)]})

    class AutoCluster(LocalCluster):
        def config(self, name: str) -> dict[str, Any]:
            data = super().config(name)
            data["health"] = {
                "gpu": "on",
                "interval": "100ms",
                "auto_uncordon": True,
                "fake_gpus": str(fakes.path(name)),
            }
            return data

    cluster = AutoCluster(redis_server.url, tmp_path, job=job_id, max_nodes=2, timing=TIMING)
    try:
        cluster.start("a", "b")
        before = cluster.wait_running(2)
        fakes.write("b", {"gpus": [gpu(0) | {"temperature_c": 97}]})  # overheating: drain
        during = cluster.wait_running(1, after_generation=before["generation"])
        assert nodes_of(during)["b"]["cordon"]["by"] == "gpu"
        fakes.write("b", {"gpus": [gpu(0)]})  # cooled down: it lifts its own cordon
        after = cluster.wait_running(2, after_generation=during["generation"])
        assert nodes_of(after)["b"]["cordon"] is None and after["restart_count"] == 0
        assert any(e["type"] == "node_uncordoned" and e["node"] == "b" for e in cluster.events())
    finally:
        cluster.stop()
