"""Issue 80: jobs sharing a node kept apart by their cgroups (supervisor/jobcgroup.py), with
real agents, a real redis-server, fake 8-GPU nodes and this kernel's real cgroups (here a v1/v2
hybrid: memory, pids and cpu in v1, the jobs' v2 cgroups in the unified hierarchy).

A job that goes over its memory is killed inside its own cgroup and says so (worker_oom); its
neighbour on the node keeps its process, generation and restart count. What a job started that
left its process group (setsid) ends with the job, and what an earlier agent's job left ends
when the next agent starts.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from nodeagent.config.isolation import PIDS_MAX
from tests.helpers.cluster import WORKER, RedisServer, nodeagentctl, wait_for
from tests.helpers.gpus import gpu
from tests.helpers.pool import PoolCluster, pool_cluster
from tests.helpers.runas import AS_TESTER
from tests.helpers.unitcaps import unit_prefix
from tests.helpers.unitcgroup import cgroup_file
from tests.helpers.users import reachable_dir

pytestmark = pytest.mark.timeout(240)
EX_CONFIG = 78


def eight_gpus(path: Path) -> dict[str, Any]:
    path.write_text(yaml.safe_dump({"gpus": [gpu(i) for i in range(8)]}))
    return {"health": {"gpu": "on", "interval": "100ms", "fake_gpus": str(path)}}


@pytest.fixture
def pool(redis_server: RedisServer, tmp_path: Path, job_id: str) -> Iterator[PoolCluster]:
    if os.geteuid() != 0:
        pytest.skip("job cgroups need root")
    with pool_cluster(redis_server.url, tmp_path, pool=job_id) as cluster:
        cluster.node_options["a"] = eight_gpus(tmp_path / "gpus-a.yaml")
        yield cluster


def records(pool: PoolCluster, job: str, event: str) -> list[dict[str, Any]]:
    return read_records(pool.job_records(job), event)


def read_records(directory: Path, event: str) -> list[dict[str, Any]]:
    path = directory / "records.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [r for r in map(json.loads, filter(None, lines)) if r["event"] == event]


def waits_saying(pool: PoolCluster, job: str, words: str) -> str:
    """The reason pending `job` gives once it says `words`."""

    def said() -> str | None:
        reason = str(pool.jobs()[job].get("reason") or "")
        return reason if words in reason else None

    return wait_for(said, 60, f"{job} to wait saying {words!r}")


def test_a_memory_hog_dies_of_its_own_limit_and_its_neighbour_keeps_running(
    pool: PoolCluster, job_id: str
) -> None:
    pool.start("a")
    pool.wait_nodes(1)
    neighbour, hog = f"{job_id}-nb"[:63], f"{job_id}-hog"[:63]
    # The neighbour is the node's biggest process: an OOM killer that looked at the whole
    # node would take it first, as the issue saw.
    pool.submit(neighbour, "1", "--gpus-per-node", "1", "--env", "HOLD_MB=600")
    pool.wait_job(neighbour, "running", world=1)
    [started] = wait_for(lambda: records(pool, neighbour, "start"), 30, "the neighbour's start")
    pid = started["pid"]
    share = int(cgroup_file(pid, "memory", "memory.limit_in_bytes"))
    total = psutil.virtual_memory().total
    page = os.sysconf("SC_PAGE_SIZE")  # the kernel keeps whole pages
    assert share == (total - total // 10) // 8 // page * page  # a GPU's share of the 8
    assert cgroup_file(pid, "pids", "pids.max").strip() == str(PIDS_MAX)

    pool.submit(
        hog,
        "1",
        "--gpus-per-node",
        "1",
        "--mem",
        "256MiB",
        "--max-restarts",
        "1",
        "--env",
        "GROW_MB=64",
    )
    failed = pool.wait_job(hog, "failed", timeout=120)
    doc = pool.show(hog)
    assert doc["restarts"] == 1 and doc["restarts_by_cause"].get("worker_oom") == 1, doc
    assert "rank 0 on a ran out of memory (its job's limit there: 256 MiB" in doc["detail"], doc
    assert "1 restarts used" in doc["detail"], doc
    assert failed["state"] == "failed"
    said = pool.ctl("--job", hog, "events", "--json").stdout.splitlines()
    failures = [e for e in map(json.loads, said) if e["type"] == "worker_failed"]
    assert failures and all(
        "out of memory (its job's limit here: 256 MiB)" in e["message"] for e in failures
    ), failures

    row = pool.jobs()[neighbour]
    assert row["state"] == "running" and row["generation"] == 1, row
    assert records(pool, neighbour, "start") == [started]  # the same process, never restarted
    assert psutil.pid_exists(pid)
    assert pool.show(neighbour)["restarts"] == 0


def test_what_a_job_detached_ends_with_it_and_its_cgroup_goes(
    pool: PoolCluster, job_id: str
) -> None:
    pool.start("a")
    pool.wait_nodes(1)
    pool.submit(job_id, "1", "--gpus-per-node", "1", "--env", "SPAWN_CHILD=detached")
    pool.wait_job(job_id, "running", world=1)
    [started] = wait_for(lambda: records(pool, job_id, "start"), 30, "the worker's start")
    child = psutil.Process(started["child"])
    assert os.getsid(child.pid) == child.pid != os.getsid(started["pid"])  # its own session
    memory = cgroup_file(child.pid, "memory", "cgroup.procs")
    assert str(child.pid) in memory.split()  # in the job's cgroup all the same

    (pool.job_records(job_id) / "exit-1").write_text("0")
    pool.wait_job(job_id, "succeeded")
    wait_for(lambda: not child.is_running(), 30, "the detached child to end with its job")
    left = [p for p in Path("/sys/fs/cgroup/unified").rglob(f"job-a.{job_id}*") if p.is_dir()]
    assert left == []


def test_what_an_earlier_agents_job_left_ends_when_the_next_agent_starts(
    pool: PoolCluster, job_id: str
) -> None:
    pool.start("a")
    pool.wait_nodes(1)
    pool.submit(job_id, "1", "--gpus-per-node", "1", "--env", "SPAWN_CHILD=detached")
    [started] = wait_for(lambda: records(pool, job_id, "start"), 60, "the worker's start")
    child = psutil.Process(started["child"])
    pool.kill_tree("a")  # the agent and its session die; the detached child is in neither
    assert child.is_running()
    pool.start("a")
    wait_for(lambda: not child.is_running(), 60, "the next agent to end the leftover")
    said = pool.agents["a"].log()
    assert "ended 1 processes an earlier agent's jobs left in their cgroups" in said, said


def test_a_job_asking_more_memory_than_a_node_has_waits_saying_so(
    pool: PoolCluster, job_id: str
) -> None:
    """The node says what its jobs share; the scheduler places nothing there that asks for
    more (a node that did not say would refuse it: model/resources.py's words, unit-tested)."""
    pool.start("a")
    pool.wait_nodes(1)
    pool.submit(job_id, "1", "--gpus-per-node", "1", "--mem", "64TiB")
    reason = waits_saying(pool, job_id, "have less memory for jobs than it asks for")
    assert reason.endswith("1 have less memory for jobs than it asks for (mem 64 TiB)"), reason
    assert pool.jobs()[job_id]["state"] == "pending"


def test_a_node_without_a_writable_cgroup_tree_exits_78_naming_it(
    tmp_path: Path, redis_server: RedisServer, job_id: str
) -> None:
    """The unit without Delegate=yes: the agent, held to its unit's capabilities, cannot make a
    cgroup where it is (a hierarchy's root here, 0555)."""
    if os.geteuid() != 0:
        pytest.skip("the unit's capabilities need root")
    config = tmp_path / "a.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "node": {"name": "a", "address": "127.0.0.1"},
                "redis": {"url": redis_server.url},
                "pool": {"name": job_id, "auth": "none"},
                "metrics": {"listen": "off"},
                "log_dir": str(tmp_path / "logs"),
                "state_dir": str(tmp_path / "state"),
            }
        )
    )
    argv = [*unit_prefix(), sys.executable, "-m", "nodeagent", "run", "--config", str(config)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == EX_CONFIG, done.stderr
    assert "isolation.cgroups: this node cannot limit its jobs'" in done.stderr
    assert "Delegate=yes" in done.stderr and "isolation.cgroups: available" in done.stderr

    config.write_text(config.read_text() + "isolation: {cgroups: available}\n")
    agent = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        nodes = ("--redis", redis_server.url, "--pool", job_id, "nodes", "--json")
        wait_for(lambda: '"a"' in nodeagentctl(*nodes).stdout, 60, "the node in its pool")
    finally:
        agent.send_signal(signal.SIGTERM)
        out, _ = agent.communicate(timeout=60)
    said = next(line for line in out.splitlines() if "isolation.cgroups: available" in line)
    assert "jobs on this node are not limited in cgroup v2, cpu" in said, said
    assert "pids: cannot make /sys/fs/cgroup/pids/probe-a." in said, said


def test_a_jobs_dev_shm_and_temp_files_are_its_own_and_go_with_it(
    pool: PoolCluster, job_id: str
) -> None:
    """Two of nobody's jobs on one node each write a file in /dev/shm and in their temp
    directory (TMPDIR): neither sees the other's, the node's /dev/shm never holds them, and
    the first one's temp directory goes when it ends, while the second's stays."""
    pool.scheduling = {"users": [str(AS_TESTER["user"]), "nobody"]}
    pool.start("a")
    pool.wait_nodes(1)
    first, second = f"{job_id}-1"[:63], f"{job_id}-2"[:63]
    with reachable_dir("nodeagent-shm-") as records:
        starts = {}
        for job in (first, second):
            (records / job).mkdir(mode=0o777)
            (records / job).chmod(0o777)  # whatever the umask
            result = pool.ctl(
                *("submit", "--name", job, "--nodes", "1", "--gpus-per-node", "1"),
                *("--user", "nobody", "--env", f"RECORD_DIR={records / job}"),
                *("--env", f"LEAVE_FILES={job}.bin", "--", sys.executable, str(WORKER)),
            )
            assert result.returncode == 0, result.stderr
            said = functools.partial(read_records, records / job, "start")
            starts[job] = wait_for(said, 60, f"{job}'s start")[0]
        for job, started in starts.items():
            assert started["shm"] == [f"{job}.bin"], started  # its own alone
            tmpdir = Path(started["tmpdir"])
            assert tmpdir.name.startswith(f"nodeagent-a.{job}-"), tmpdir
            assert (tmpdir / f"{job}.bin").is_file() and tmpdir.stat().st_mode & 0o777 == 0o700
            assert not Path("/dev/shm", f"{job}.bin").exists()  # not the node's /dev/shm

        (records / first / "exit-1").write_text("0")
        pool.wait_job(first, "succeeded")
        gone = Path(starts[first]["tmpdir"])
        wait_for(lambda: not gone.exists(), 30, "the first job's temp directory to go")
        assert Path(starts[second]["tmpdir"], f"{second}.bin").is_file()
        assert pool.ctl("cancel", second).returncode == 0


def two_jobs_on(
    pool: PoolCluster, job_id: str, path: Path, gpus: list[dict[str, Any]], *flags: str
) -> dict[int, tuple[str, str]]:
    """Two one-GPU jobs (submitted with `flags`) started on a fake node of `gpus` (`path`): each
    one's GPU -> its cgroup's cpuset and its worker's Cpus_allowed_list."""
    path.write_text(yaml.safe_dump({"gpus": gpus}))
    pool.node_options["a"]["health"]["fake_gpus"] = str(path)
    pool.start("a")
    pool.wait_nodes(1)
    jobs = [f"{job_id}-{n}"[:63] for n in range(2)]
    for job in jobs:
        pool.submit(job, "1", "--gpus-per-node", "1", *flags)
    found = {}
    for job in jobs:
        [started] = wait_for(functools.partial(records, pool, job, "start"), 60, f"{job} starts")
        index = int(str(started["cuda"]).removeprefix("GPU-fake-"))
        cpuset = cgroup_file(started["pid"], "cpuset", "cpuset.cpus").strip()
        status = Path(f"/proc/{started['pid']}/status").read_text()
        allowed = next(line for line in status.splitlines() if line.startswith("Cpus_allowed_list"))
        found[index] = (cpuset, allowed.split()[-1])
    return found


def test_workers_start_on_the_cpus_near_their_gpus(
    pool: PoolCluster, job_id: str, tmp_path: Path
) -> None:
    """A fake node of two sockets, one CPU each here: the even GPUs near CPU 0, the odd ones
    near CPU 1, as NVML's CPU affinity says. Each one-GPU job's worker runs on its GPU's CPU;
    8 GPUs on 2 cores divide no cores: the jobs' cpusets are the node's."""
    gpus = [{**gpu(i), "cpus": str(i % 2)} for i in range(8)]
    found = two_jobs_on(pool, job_id, tmp_path / "sockets.yaml", gpus)
    assert found == {index: ("0-1", str(index % 2)) for index in found}, found


def test_jobs_sharing_a_node_each_hold_their_gpus_cores(
    pool: PoolCluster, job_id: str, tmp_path: Path
) -> None:
    """A fake node of two GPUs on this machine's two cores, GPU 0 near CPU 1 and GPU 1 near
    CPU 0: each one-GPU job's cgroup holds its GPU's core alone (cpuset), its worker runs
    there; a job asking for more CPUs per GPU than the node holds waits, saying so."""
    gpus = [{**gpu(i), "cpus": str(1 - i)} for i in range(2)]
    held = two_jobs_on(pool, job_id, tmp_path / "two.yaml", gpus, "--cpus-per-gpu", "1")
    assert held == {0: ("1", "1"), 1: ("0", "0")}, held

    greedy = f"{job_id}-greedy"[:63]
    pool.submit(greedy, "1", "--gpus-per-node", "1", "--cpus-per-gpu", "2")
    reason = waits_saying(pool, greedy, "CPUs per GPU")
    assert reason.endswith("1 hold fewer CPUs per GPU than it asks for (2)"), reason
