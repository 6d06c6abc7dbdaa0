"""Issue 66 on a real GPU and driver: which device node is a GPU's (NVML's minor number), and a
pool job's view of the GPU it holds, by CUDA_VISIBLE_DEVICES and by the device cgroup
(supervisor/devices.py): its worker opens its own GPU's /dev/nvidiaN and nvidiactl, and is
refused every other GPU's. Run on a GPU machine: pytest -m gpu (skipped where NVML cannot be
opened; the device cgroup part where the machine has no writable cgroup v2 or no CAP_BPF).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeagent.gpu.nvml import NvmlBackend, load_pynvml
from nodeagent.gpu.readings import GpuReading
from tests.helpers.cluster import RedisServer, wait_for
from tests.helpers.devicenodes import delegated_cgroup, drop_in_caps, in_cgroup
from tests.helpers.pool import pool_cluster

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(180)]


def readings() -> tuple[GpuReading, ...]:
    backend = NvmlBackend(load_pynvml())
    backend.open()
    try:
        return backend.sample()
    finally:
        backend.close()


def test_each_gpus_minor_names_its_device_node() -> None:
    for reading in readings():
        assert reading.minor is not None, reading
        found = os.stat(f"/dev/nvidia{reading.minor}")
        assert stat.S_ISCHR(found.st_mode), reading
        assert (os.major(found.st_rdev), os.minor(found.st_rdev)) == (195, reading.minor)


@contextlib.contextmanager
def device_links(gpus: tuple[GpuReading, ...]) -> Iterator[Path]:
    """A directory of links to every GPU's /dev/nvidiaN and to /dev/nvidiactl, for the test
    worker's DEVICES_DIR (tests/helpers/worker.py opens each)."""
    with tempfile.TemporaryDirectory(prefix="nodeagent-gpus-") as name:
        directory = Path(name)
        directory.chmod(0o755)
        for minor in [*(g.minor for g in gpus if g.minor is not None), 255]:
            (directory / f"nvidia{minor}").symlink_to(f"/dev/nvidia{minor}")
        yield directory


def test_a_pool_job_with_one_gpu_sees_it_by_uuid_and_opens_only_its_device_node(
    redis_server: RedisServer, tmp_path: Path, job_id: str
) -> None:
    """One real node, constraining devices as the unit's drop-in lets it: a one-GPU job's
    worker is handed the GPU the node says it holds, by NVML's UUID, and may open that GPU's
    device node and nvidiactl, and no other GPU's."""
    gpus = readings()
    with contextlib.ExitStack() as stack:
        cgroup = stack.enter_context(delegated_cgroup())
        pool = stack.enter_context(pool_cluster(redis_server.url, tmp_path, pool=job_id))
        devices = stack.enter_context(device_links(gpus))
        pool.node_options["a"] = {"health": {"gpu": "on", "constrain_devices": True}}
        pool.prefixes["a"], pool.caps["a"] = in_cgroup(cgroup), drop_in_caps()
        pool.start("a")
        pool.wait_nodes(1, timeout=60)
        pool.submit(job_id, "1", "--gpus-per-node", "1", "--env", f"DEVICES_DIR={devices}")
        pool.wait_job(job_id, "running", world=1, timeout=90)
        path = pool.job_records(job_id) / "records.jsonl"

        def start() -> dict[str, object] | None:
            lines = path.read_text().splitlines() if path.exists() else []
            return next((r for r in map(json.loads, lines) if r["event"] == "start"), None)

        found = wait_for(start, 60, "the worker's start record")

        def held() -> list[str] | None:
            units = json.loads(pool.ctl("nodes", "--json").stdout)["nodes"][0]["gpus"]
            return [unit["uuid"] for unit in units if unit["job"] == job_id] or None

        mine = wait_for(held, 30, "the node to say which GPU the job holds")
        assert found["cuda"] == mine[0] and mine[0] in {g.uuid for g in gpus}, (found, mine)
        own = next(g for g in gpus if g.uuid == found["cuda"])
        expected = {f"nvidia{g.minor}": "EPERM" for g in gpus} | {f"nvidia{own.minor}": "ok"}
        assert found["devices"] == {**expected, "nvidia255": "ok"}, found
