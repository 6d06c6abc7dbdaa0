"""Dependencies (issue 67) with real agents and a real redis-server: a pipeline of three jobs,
the middle one failing, and a clean-up that runs only because it failed. Each waits saying for
what (`jobs`, `show`); a job whose parent succeeded is admitted at once; one whose parent
failed under afterok ends saying so, instead of waiting for ever; a dependency on a job the
pool does not have is refused at submission."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.cluster import RedisServer
from tests.helpers.pool import PoolCluster, pool_cluster

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def pool(redis_server: RedisServer, tmp_path: Path, job_id: str) -> Iterator[PoolCluster]:
    with pool_cluster(redis_server.url, tmp_path, pool=job_id) as cluster:
        cluster.start("a", "b")
        cluster.wait_nodes(2)
        yield cluster


def ended(pool: PoolCluster, job: str, code: int) -> None:
    """Its running generation's workers exit with `code`."""
    generation = pool.wait_job(job, "running", world=1)["generation"]
    (pool.job_records(job) / f"exit-{generation}").write_text(str(code))


def test_a_pipeline_runs_in_order_and_a_failed_stage_ends_what_needed_its_success(
    pool: PoolCluster, job_id: str
) -> None:
    pre, train, evaluate, cleanup = (
        f"{job_id}-{s}"[:63] for s in ("pre", "train", "eval", "clean")
    )
    pool.submit(pre, "1")
    pool.submit(train, "1", "--dependency", f"afterok:{pre}", "--max-restarts", "0")
    pool.submit(evaluate, "1", "--dependency", f"afterok:{pre}:{train}")
    pool.submit(cleanup, "1", "--dependency", f"afternotok:{train}")
    pool.wait_job(pre, "running", world=1)
    rows = pool.jobs()
    assert rows[train]["state"] == "pending"
    assert rows[train]["reason"] == f"waits for {pre} to succeed (afterok)"
    assert pool.show(evaluate)["dependency"] == f"afterok:{pre}:{train}"

    ended(pool, pre, 0)
    pool.wait_job(pre, "succeeded")
    ended(pool, train, 1)  # admitted once pre succeeded; then its workers fail, no restart left
    pool.wait_job(train, "failed")
    done = pool.wait_job(evaluate, "cancelled")
    assert done["reason"] == (
        f"dependency never satisfied: {train} failed, and it waited for its success"
    )
    ended(pool, cleanup, 0)  # afternotok: it runs because train failed
    pool.wait_job(cleanup, "succeeded")
    assert "dependency never satisfied" in pool.show(evaluate)["reason"]


def test_a_dependency_follows_the_run_it_named_not_a_later_job_under_its_id(
    pool: PoolCluster, job_id: str
) -> None:
    """pre succeeds; then its ended id is taken over by a job that is cancelled. The job that
    waited for pre's success and another's still runs once the other succeeds: it was bound to
    pre's run, not to the id."""
    pre, other, after = (f"{job_id}-{x}"[:63] for x in ("pre", "other", "after"))
    pool.submit(pre, "1")
    pool.submit(other, "1", "--hold")
    pool.submit(after, "1", "--dependency", f"afterok:{pre}:{other}")
    ended(pool, pre, 0)
    pool.wait_job(pre, "succeeded")
    for told in pool.job_records(pre).glob("exit-*"):
        told.unlink()  # the next run of the id does not end by itself
    pool.submit(pre, "1")  # the id taken over by another run
    assert pool.ctl("cancel", pre).returncode == 0
    pool.wait_job(pre, "cancelled")
    assert pool.jobs()[after]["state"] == "pending"
    assert pool.ctl("release", other).returncode == 0
    ended(pool, other, 0)
    pool.wait_job(other, "succeeded")
    pool.wait_job(after, "running", world=1)


def test_a_dependency_on_a_job_the_pool_does_not_have_is_refused(
    pool: PoolCluster, job_id: str
) -> None:
    said = pool.ctl(
        "submit", "--name", f"{job_id}-x"[:63], "--dependency", "afterok:no-such-job",
        "--", "true",
    )  # fmt: skip
    assert said.returncode == 2
    assert "dependency: no job or array 'no-such-job' in pool" in said.stderr
    said = pool.ctl("submit", "--dependency", "afterok", "--", "true")
    assert said.returncode == 2 and "singleton names no job, the others at least one" in (
        said.stderr
    )


def test_a_dependency_on_an_arrays_id_waits_for_every_task(pool: PoolCluster, job_id: str) -> None:
    """As Slurm's afterok on an array's id: the dependent waits while any task has not ended,
    and ends saying why once a task ended without succeeding (its tasks cancelled here)."""
    array, after = f"{job_id}-arr"[:60], f"{job_id}-after"[:63]
    said = pool.ctl(
        "submit", "--name", array, "--array", "0-2", "--nodes", "1", "--", "sleep", "600"
    )
    assert said.returncode == 0, said.stderr
    said = pool.ctl(
        "submit", "--name", after, "--nodes", "1", "--dependency", f"afterok:{array}",
        "--", "true",
    )  # fmt: skip
    assert said.returncode == 0, said.stderr
    row = pool.wait_job(after, "pending")
    assert row["reason"] == f"waits for {array} to succeed (afterok)"
    assert pool.show(after)["dependency"] == f"afterok:{array}"
    assert pool.ctl("cancel", array).returncode == 0  # every task
    row = pool.wait_job(after, "cancelled")
    assert f"dependency never satisfied: {array} failed" in row["reason"]
