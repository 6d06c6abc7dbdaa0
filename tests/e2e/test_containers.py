"""End to end: a DDP job whose workers run in the job's own image (real podman, real agents,
a real Redis, real gloo training), as the job's user, recovering a worker kill and a lost node
as a bare job does; its containers are fenced and cleaned up by cgroup.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeagent.supervisor import cgroups
from tests.helpers.cluster import LocalCluster, RedisServer, local_cluster, wait_for
from tests.helpers.images import (
    MARKER,
    RUNC,
    build_image,
    host_software_mounts,
    podman_missing,
    remove_image,
)
from tests.helpers.training import check_history, latest_step, training_entrypoint

pytest.importorskip("torch")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.skipif(podman_missing() is not None, reason=str(podman_missing())),
]

STEPS, EVERY = 40, 5
NOBODY = 65534  # Debian's nobody: a user that is not the agent's


@pytest.fixture
def image() -> Iterator[str]:
    name = build_image(f"nodeagent-e2e-{uuid.uuid4().hex[:8]}")
    yield name
    remove_image(name)


def _containers(tmp_path: Path) -> dict[str, object]:
    return {
        "allowed": True,
        "images": ["localhost/"],
        "mount_sources": [m.split(":")[0] for m in host_software_mounts(tmp_path).split(",")],
        "oci_runtime": RUNC[0].split("=")[1] if RUNC else None,
        "ulimits": ["nofile=4096:4096", "nproc=4096:4096"],
    }


def _workers(job: str, node: str) -> list[int]:
    """The training processes in `node`'s containers (host pids), not their init."""
    found = []
    for pid in cgroups.members(f"{cgroups.PREFIX}/{job}"):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            cgroup = Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            continue
        python = Path(cmdline[0].decode(errors="replace")).name.startswith("python")
        if f"/{node}-g" in cgroup and python and any(b"train_ddp.py" in p for p in cmdline):
            found.append(pid)
    return found


@pytest.fixture
def cluster(
    redis_server: RedisServer, job_id: str, tmp_path: Path, image: str
) -> Iterator[LocalCluster]:
    tmp_path.chmod(0o777)  # the job's user writes its checkpoints and records below it
    with local_cluster(
        redis_server.url,
        tmp_path,
        job=job_id,
        min_nodes=1,
        max_nodes=2,
        max_restarts=5,
        timing={"stop_grace_period": "15s", "hang_timeout": "10s"},
        entrypoint=training_entrypoint(tmp_path, STEPS, EVERY),
        job_options={
            "user": "nobody",
            "allow_root": False,
            "container": {"image": image, "mounts": host_software_mounts(tmp_path)},
        },
        node_options={"containers": _containers(tmp_path)},
    ) as running:
        for directory in ("records", "logs"):
            (tmp_path / directory).mkdir(exist_ok=True)
            (tmp_path / directory).chmod(0o777)
        yield running
    for pid in cgroups.members(f"{cgroups.PREFIX}/{job_id}"):
        os.kill(pid, signal.SIGKILL)  # what a failed test left


def test_a_containerised_job_runs_as_its_user_and_recovers(
    cluster: LocalCluster, image: str
) -> None:
    cluster.start("a", "b")
    wait_for(lambda: latest_step(cluster) >= 8, 120, "training to reach step 8")
    for node in ("a", "b"):
        (pid,) = _workers(cluster.job, node)
        status = Path(f"/proc/{pid}/status").read_text()
        assert f"Uid:\t{NOBODY}\t{NOBODY}" in status, status  # the job's user, inside
        # The worker's root is the image's: its marker, read through /proc from outside.
        assert Path(f"/proc/{pid}/root{MARKER}").read_text().strip() == image

    os.kill(_workers(cluster.job, "b")[0], signal.SIGKILL)  # a worker dies inside its container
    wait_for(lambda: cluster.status()["restart_count"] == 1, 60, "the restart")
    wait_for(lambda: latest_step(cluster) >= 20, 120, "training to go on after the restart")

    # Node b is lost: its agent and everything under it die. The container is not under it, so
    # a power loss is its cgroup killed too (the fence keeper, a child of the agent, died).
    cluster.kill_tree("b")
    for pid in _workers(cluster.job, "b"):
        os.kill(pid, signal.SIGKILL)
    cluster.wait_status(lambda d: d["state"] == "succeeded", 180, "the job to succeed")
    gens = check_history(cluster, STEPS, EVERY)
    assert [g.world for g in gens] == [2, 2, 1]
    wait_for(lambda: not cgroups.members(f"{cgroups.PREFIX}/{cluster.job}"), 30, "no container")
