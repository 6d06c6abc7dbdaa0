"""Issue 82, step 1: `nodeagentctl alloc` holds nodes of a real pool (real agents, a real
redis-server, fake 2-GPU nodes) and runs a command here with the allocation's variables; its
end (the command's exit, its time limit) ends the other.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from tests.helpers.cluster import RedisServer, wait_for
from tests.helpers.gpus import gpu
from tests.helpers.pool import PoolCluster, pool_cluster

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def pool(redis_server: RedisServer, tmp_path: Path, job_id: str) -> Any:
    with pool_cluster(redis_server.url, tmp_path, pool=job_id) as cluster:
        for node in ("a", "b"):
            path = tmp_path / f"gpus-{node}.yaml"
            gpus = [{**gpu(i), "uuid": f"GPU-{node}{i}"} for i in range(2)]
            path.write_text(yaml.safe_dump({"gpus": gpus}))
            cluster.node_options[node] = {
                "health": {"gpu": "on", "interval": "100ms", "fake_gpus": str(path)}
            }
        cluster.start("a", "b")
        cluster.wait_nodes(2)
        yield cluster


def holders(job: str) -> list[int]:
    """The allocation's holders (`sleep infinity` as its workers) running on this machine."""
    found = []
    for proc in psutil.process_iter(["cmdline", "environ"]):
        try:
            env = proc.info["environ"] or {}
            if proc.info["cmdline"] == ["sleep", "infinity"] and env.get("NODEAGENT_JOB_ID") == job:
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


def test_an_allocation_runs_a_command_with_its_variables_and_ends_with_it(
    pool: PoolCluster, job_id: str, tmp_path: Path
) -> None:
    said = tmp_path / "env"
    script = f"env > {said}; test -n \"$(pgrep -f 'sleep infinity')\"; exit 3"
    done = pool.ctl(
        *("alloc", "--name", job_id, "--nodes", "2", "--gpus-per-node", "1", "--time", "1h"),
        *("--", "sh", "-c", script),
    )
    assert done.returncode == 3, done.stderr  # the command's own exit
    assert f"granted job allocation {job_id} on a,b" in done.stderr, done.stderr
    env = dict(line.split("=", 1) for line in said.read_text().splitlines() if "=" in line)
    assert env["NODEAGENT_JOB_ID"] == env["SLURM_JOB_ID"] == job_id
    assert env["NODEAGENT_NODELIST"] == env["SLURM_JOB_NODELIST"] == "a,b"
    assert env["SLURM_NNODES"] == "2" and env["SLURM_GPUS_PER_NODE"] == "1"
    assert env["MASTER_ADDR"] == "127.0.0.1" and int(env["MASTER_PORT"]) > 0
    given = dict(pair.split("=") for pair in env["NODEAGENT_GPUS"].split())
    assert set(given) == {"a", "b"} and given["a"] in ("GPU-a0", "GPU-a1"), given
    # Its end is the allocation's: cancelled, its holders gone, listed as an allocation.
    ended = pool.wait_job(job_id, "cancelled", timeout=60)
    assert ended["kind"] == "allocation"
    assert "relinquishing job allocation" in done.stderr
    wait_for(lambda: not holders(job_id), 30, "the holders to end")
    assert pool.show(job_id)["kind"] == "allocation"


def test_an_allocation_past_its_time_limit_ends_the_shell_in_it(
    pool: PoolCluster, job_id: str
) -> None:
    """A shell that never exits: the allocation's time limit ends it (SIGHUP), and the
    command exits 1 saying why."""
    began = time.monotonic()
    ctl = [sys.executable, "-m", "nodeagent.cli.ctl", "--redis", pool.redis_url]
    proc = subprocess.Popen(
        [
            *ctl,
            "--pool",
            pool.pool,
            "alloc",
            "--name",
            job_id,
            "--nodes",
            "1",
            "--time",
            "5s",
            "--",
            "sleep",
            "600",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: holders(job_id), 60, "the allocation's holder")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert f"job allocation {job_id} has ended (timeout" in err, err
    assert time.monotonic() - began < 120
    assert pool.jobs()[job_id]["state"] == "timeout"
    wait_for(lambda: not holders(job_id), 30, "the holder to end")


def test_an_allocation_that_cannot_be_held_is_refused_before_anything_is_written(
    pool: PoolCluster, job_id: str
) -> None:
    said = pool.ctl("alloc", "--name", job_id, "--nodes", "2", "--gpus-per-node", "0")
    assert said.returncode == 2, said.stderr
    assert "gpus_per_node" in said.stderr
    assert job_id not in pool.jobs()


def test_sigterm_sent_to_alloc_reaches_its_shell_whose_end_ends_the_allocation(
    pool: PoolCluster, job_id: str, tmp_path: Path
) -> None:
    """As a login session's end sends SIGTERM (or SIGHUP) to what it ran: passed on to the
    shell, which exits; its exit relinquishes the allocation."""
    told, started = tmp_path / "told", tmp_path / "started"
    script = f"trap 'echo TERM > {told}; exit 0' TERM; touch {started}; while :; do sleep 0.1; done"
    ctl = [sys.executable, "-m", "nodeagent.cli.ctl", "--redis", pool.redis_url, "--pool"]
    proc = subprocess.Popen(
        [*ctl, pool.pool, "alloc", "--name", job_id, "--", "sh", "-c", script],
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(started.exists, 60, "the shell in the allocation")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert told.read_text().strip() == "TERM"
    pool.wait_job(job_id, "cancelled", timeout=60)


def test_sigterm_while_it_waits_cancels_the_allocation(pool: PoolCluster, job_id: str) -> None:
    """An allocation that cannot be held yet (a node too many): SIGTERM to alloc cancels it."""
    ctl = [sys.executable, "-m", "nodeagent.cli.ctl", "--redis", pool.redis_url, "--pool"]
    proc = subprocess.Popen(
        [*ctl, pool.pool, "alloc", "--name", job_id, "--nodes", "3", "--", "true"],
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: pool.jobs().get(job_id, {}).get("state") == "pending", 60, "it pending")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "cancelled while it waited" in err, err
    pool.wait_job(job_id, "cancelled", timeout=60)


def test_an_alloc_killed_with_its_shell_leaves_no_allocation_held(
    pool: PoolCluster, job_id: str, tmp_path: Path
) -> None:
    """A login host lost, as SIGKILL to alloc and everything it ran: its holder's lease is
    not renewed, and the pool leader cancels the allocation (pool/holders.py)."""
    started = tmp_path / "started"
    ctl = [sys.executable, "-m", "nodeagent.cli.ctl", "--redis", pool.redis_url, "--pool"]
    proc = subprocess.Popen(
        [
            *ctl,
            pool.pool,
            "alloc",
            "--name",
            job_id,
            "--",
            "sh",
            "-c",
            f"touch {started}; sleep 600",
        ],
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    wait_for(started.exists, 60, "the shell in the allocation")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    ended = pool.wait_job(job_id, "cancelled", timeout=120)
    assert "stopped renewing" in ended["reason"], ended
    wait_for(lambda: not holders(job_id), 30, "the holder to end")
