"""Issue 66: the device cgroup (supervisor/devices.py) against this machine's kernel, with
stand-ins for /dev/nvidia* (tests/helpers/devicenodes.py: ENXIO where allowed, EPERM where not).

The agent runs from a cgroup the test makes below its own, as systemd's `Delegate=yes` gives the
unit one, with the shipped unit's capabilities plus the drop-in's
(systemd/nodeagent.service.d/constrain-devices.conf), through `setpriv` (tests/helpers/unitcaps.py),
and starts its workers as another user.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodeagent.supervisor.devices import JobDevices
from nodeagent.supervisor.jobcgroup import JobCgroup, JobCgroupError, Layout
from nodeagent.supervisor.spares import Spawner
from nodeagent.supervisor.spec import WorkerSpec
from tests.helpers.cluster import wait_for
from tests.helpers.devicenodes import (
    allowed_only,
    delegated_cgroup,
    device_nodes,
    drop_in_caps,
    in_cgroup,
)
from tests.helpers.runas import AS_TESTER
from tests.helpers.unitcaps import unit_prefix

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]
NOBODY = 65534
MINORS = {0: 10, 1: 11, 2: 12, 3: 13}  # NVML index -> minor, as nvmlDeviceGetMinorNumber says
EX_CONFIG = 78


@pytest.fixture
def devices() -> Iterator[Path]:
    with device_nodes(MINORS.values()) as directory:
        yield directory


@pytest.fixture
def delegated() -> Iterator[Path]:
    """Where the agent runs: a cgroup below the test's own."""
    with delegated_cgroup() as path:
        yield path


def started(tmp_path: Path, cgroup: Path, devices: Path, job: str, *confines: str) -> Any:
    minors = ",".join(f"{i}:{m}" for i, m in MINORS.items())
    args = ["n1", job, str(NOBODY), str(NOBODY), str(devices), minors, *confines]
    result = subprocess.run(
        [
            *in_cgroup(cgroup),
            *unit_prefix(extra=drop_in_caps()),
            sys.executable,
            "-m",
            "tests.helpers.devicesas",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def refused_but(*names: str) -> dict[str, str]:
    return allowed_only(MINORS.values(), *names)


def test_a_jobs_workers_open_only_its_gpus_and_a_new_set_replaces_the_old(
    tmp_path: Path, devices: Path, delegated: Path, job_id: str
) -> None:
    """Under the unit's capabilities and the drop-in's, from its delegated cgroup, the agent
    confines a job to GPU 1, then to GPUs 2 and 3, then to none: each worker, started as
    nobody, opens exactly the job's GPUs' nodes (NVML's minors, not its indices) and nvidiactl,
    and sits in the job's cgroup below the agent's; the cgroup goes with the spawner."""
    found = started(tmp_path, delegated, devices, job_id, "1", "2,3", "-")
    assert "runs" in found, found
    opened = [run["opened"] for run in found["runs"]]
    assert opened == [
        refused_but("nvidia11"),
        refused_but("nvidia12", "nvidia13"),
        refused_but(),
    ]
    (where,) = {run["cgroup"] for run in found["runs"]}
    assert where.endswith(f"/{delegated.name}/job-n1.{job_id}"), where
    assert found["left"] is False


def test_an_earlier_agents_job_cgroup_neither_refuses_nor_blocks_the_next(
    tmp_path: Path, devices: Path, delegated: Path, job_id: str
) -> None:
    """What a killed agent leaves: the job's cgroup, its program (GPU 0 only) still attached.
    Empty, the next agent's start removes it, so the job's new GPU is not refused by what no
    one holds any more; still holding a process, it is left (never waited for) and the job
    gets `+1`, until a later start finds it empty."""
    first = started(tmp_path, delegated, devices, job_id, "0")
    assert [run["opened"] for run in first["runs"]] == [refused_but("nvidia10")]
    left = delegated / f"job-n1.{job_id}"
    left.mkdir()
    again = started(tmp_path, delegated, devices, job_id, "1")
    assert [run["opened"] for run in again["runs"]] == [refused_but("nvidia11")]
    assert not left.exists()

    left.mkdir()
    holding = subprocess.Popen([*in_cgroup(left), "sleep", "60"])
    try:
        wait_for(lambda: (left / "cgroup.procs").read_text().strip(), 10, "a process in it")
        busy = started(tmp_path, delegated, devices, job_id, "2")
        assert [run["opened"] for run in busy["runs"]] == [refused_but("nvidia12")]
        assert busy["runs"][0]["cgroup"].endswith(f"/job-n1.{job_id}+1"), busy
        assert left.exists()
    finally:
        holding.kill()
        holding.wait()
    wait_for(lambda: not (left / "cgroup.procs").read_text().strip(), 10, "it to empty")
    later = started(tmp_path, delegated, devices, job_id, "3")
    assert later["runs"][0]["cgroup"].endswith(f"/job-n1.{job_id}"), later
    assert [p.name for p in delegated.iterdir() if p.is_dir()] == []


def test_without_the_drop_in_the_agent_exits_78_naming_what_the_node_lacks(
    tmp_path: Path, delegated: Path, job_id: str
) -> None:
    """`health.constrain_devices` under the unit alone (no CAP_BPF, CAP_NET_ADMIN): the agent
    refuses to start, exit 78 so that systemd does not restart it, saying what is missing."""
    if os.geteuid() != 0:
        pytest.skip("the unit's capabilities are root's")
    config = tmp_path / "config.yaml"
    document = {
        "node": {"name": "d1", "address": "127.0.0.1"},
        "redis": {"url": "redis://127.0.0.1:1/0"},  # nothing listens: not reached
        "job": {"id": job_id, "entrypoint": [sys.executable, "-c", "pass"], **AS_TESTER},
        "metrics": {"listen": "127.0.0.1:0"},
        "health": {"gpu": "auto", "constrain_devices": True},
        # the devices alone: this test's cgroup is in the unified hierarchy only
        # (tests/integration/test_isolation.py: the limits' own exit 78)
        "isolation": {"cgroups": "off"},
        "log_dir": str(tmp_path / "logs"),
        "state_dir": str(tmp_path / "state"),
    }
    config.write_text(yaml.safe_dump(document))
    result = subprocess.run(
        [
            *in_cgroup(delegated),
            *unit_prefix(),
            sys.executable,
            "-m",
            "nodeagent",
            "run",
            "--config",
            str(config),
        ],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=ROOT,
    )
    assert result.returncode == EX_CONFIG, result.stderr[-3000:]
    said = result.stderr
    assert "health.constrain_devices: this node cannot confine workers" in said, said
    assert "it needs CAP_BPF and CAP_NET_ADMIN" in said, said
    assert "Delegate=yes" in said and "or set it false" in said, said
    assert [p.name for p in delegated.iterdir() if p.is_dir()] == []  # the probe's cgroup went


def test_a_worker_that_cannot_enter_its_job_cgroup_is_not_started(
    delegated: Path, job_id: str
) -> None:
    """Its cgroup removed under the agent (by an operator, say): the worker is not started
    outside it, and the start's error says why."""
    cgroup = JobCgroup(Layout(delegated, {delegated: frozenset()}), "n1", job_id, None)
    spawner = Spawner(cgroup=cgroup, devices=JobDevices(cgroup, MINORS.get, lambda: [1]))
    spec = WorkerSpec(
        rank=0,
        local_rank=0,
        argv=("/bin/true",),
        env={"PATH": "/usr/bin:/bin"},
        cwd="/",
        log_path=Path("/nonexistent/rank-0.log"),
        progress_path=Path("/nonexistent/rank-0.progress"),
    )
    popen, _ = spawner.spawn(spec)
    assert popen.wait(timeout=30) == 0
    assert popen.stdout is not None
    popen.stdout.close()
    assert cgroup.unified is not None
    cgroup.unified.rmdir()
    with pytest.raises(JobCgroupError, match="cannot enter its job's cgroup: No such device"):
        spawner.spawn(spec)
    spawner.close()
