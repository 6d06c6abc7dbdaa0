"""Job arrays (issue 67) with real agents and a real redis-server: one submission, a job per
task with Slurm's variables, at most LIMIT running at once, and hold, release and cancel on the
whole array or on one task."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.cluster import RedisServer, wait_for
from tests.helpers.pool import PoolCluster, pool_cluster

pytestmark = pytest.mark.timeout(180)
SAYS = 'echo "$SLURM_ARRAY_JOB_ID $NODEAGENT_ARRAY_TASK_ID of $SLURM_ARRAY_TASK_COUNT" > "$OUT/$1"'


@pytest.fixture
def pool(redis_server: RedisServer, tmp_path: Path, job_id: str) -> Iterator[PoolCluster]:
    with pool_cluster(redis_server.url, tmp_path, pool=job_id) as cluster:
        cluster.start("a", "b", "c")
        cluster.wait_nodes(3)
        yield cluster


def states(pool: PoolCluster, array: str) -> dict[str, str]:
    return {j: row["state"] for j, row in pool.jobs().items() if j.startswith(f"{array}_")}


def test_an_array_runs_its_tasks_limit_at_a_time_and_its_verbs_take_the_whole_or_one(
    pool: PoolCluster, tmp_path: Path, job_id: str
) -> None:
    array = f"{job_id}-sweep"[:40]
    out = tmp_path / "out"
    out.mkdir()
    script = f"{SAYS.replace('$1', '$NODEAGENT_ARRAY_TASK_ID')}; exec sleep 600"
    said = pool.ctl(
        "submit", "--name", array, "--array", "0-3%2", "--nodes", "1", "--env", f"OUT={out}",
        "--", "/bin/sh", "-c", script,
    )  # fmt: skip
    assert said.returncode == 0, said.stderr
    assert said.stdout.strip().startswith(f"array {array}: 4 tasks submitted")
    tasks = [f"{array}_{i}" for i in range(4)]
    wait_for(lambda: (out / "1").exists() and (out / "0").exists(), 60, "tasks 0 and 1 running")
    assert (out / "1").read_text().split() == [array, "1", "of", "4"]
    assert states(pool, array) == dict(zip(tasks, ["running"] * 2 + ["pending"] * 2, strict=True))
    assert pool.jobs()[tasks[2]]["reason"] == f"array {array} runs 2 tasks at once, its limit"
    listed = pool.ctl("jobs", "--array", array, "--json")
    assert sorted(row["job"] for row in json.loads(listed.stdout)["jobs"]) == tasks

    held = pool.ctl("hold", array)  # the pending ones; the running ones cannot be held
    assert held.returncode == 0 and f"array {array}: hold done to 2 of 4 tasks" in held.stdout
    assert pool.ctl("cancel", tasks[0]).returncode == 0  # one task alone
    pool.wait_job(tasks[0], "cancelled")
    assert pool.jobs()[tasks[2]]["state"] == "pending"  # held, though the limit has room
    assert pool.ctl("release", tasks[2]).returncode == 0
    wait_for(lambda: (out / "2").exists(), 60, "task 2 running once released")
    assert not (out / "3").exists()

    gone = pool.ctl("cancel", array)
    assert gone.returncode == 0 and f"array {array}: cancel requested for 3 tasks" in gone.stdout
    wait_for(lambda: set(states(pool, array).values()) == {"cancelled"}, 60, "every task cancelled")
    assert pool.ctl("cancel", array).returncode == 2  # nothing left to cancel


def test_an_array_whose_task_ids_are_taken_is_refused_whole(pool: PoolCluster, job_id: str) -> None:
    array = f"{job_id}-taken"[:40]
    pool.submit(f"{array}_1", "1")
    said = pool.ctl("submit", "--name", array, "--array", "0-2", "--", "true")
    assert said.returncode == 2 and f"job {array}_1 exists in pool" in said.stderr
    assert f"{array}_0" not in pool.jobs()  # nothing of it written


def test_a_live_arrays_id_is_not_given_to_another_array_or_job(
    pool: PoolCluster, job_id: str
) -> None:
    array = f"{job_id}-live"[:40]
    said = pool.ctl("submit", "--name", array, "--array", "1-2", "--", "sleep", "600")
    assert said.returncode == 0, said.stderr
    again = pool.ctl("submit", "--name", array, "--array", "0", "--", "true")
    assert again.returncode == 2 and f"{array} is an array of 2 tasks not ended" in again.stderr
    plain = pool.ctl("submit", "--name", array, "--", "true")
    assert plain.returncode == 2 and f"{array} is an array of 2 tasks not ended" in plain.stderr
    assert pool.ctl("cancel", array).returncode == 0
    wait_for(lambda: set(states(pool, array).values()) == {"cancelled"}, 60, "its tasks ended")
    taken = pool.ctl("submit", "--name", array, "--", "true")  # ended: the id is free again
    assert taken.returncode == 0, taken.stderr
