"""views/waits.py: what `--wait` waits for, from one read (the CLI polls; the conditions are
decided here once)."""

from __future__ import annotations

from dataclasses import replace

from nodeagent.model.job import JobRecord
from nodeagent.model.pool import PoolJob, PoolJobState
from nodeagent.state import JobState
from nodeagent.views import waits

RUNNING = JobRecord(1, JobState.RUNNING, "", 2, 1, 4, 1, 3, members=("a", "b"))


def test_an_ended_jobs_exit_code_is_sbatch_waits() -> None:
    ended = PoolJob(PoolJobState.SUCCEEDED, 1, 0)
    assert waits.exit_code(ended) == 0
    assert waits.exit_code(replace(ended, state=PoolJobState.FAILED, exit_code=3)) == 3
    assert waits.exit_code(replace(ended, state=PoolJobState.CANCELLED)) == 1


def test_a_job_runs_at_its_new_size_once_its_members_are_that_many() -> None:
    assert waits.runs_on(RUNNING, 2)
    assert not waits.runs_on(RUNNING, 3)  # the target not taken yet
    assert not waits.runs_on(replace(RUNNING, target_nodes=3), 3)  # a member not joined yet
    assert not waits.runs_on(replace(RUNNING, state=JobState.RESTARTING), 2)
    assert not waits.runs_on(None, 2)
