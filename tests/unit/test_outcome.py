"""A single-job agent's exit code from the job's terminal record (nodeagent.job.outcome)."""

from __future__ import annotations

import pytest

from nodeagent.job.outcome import exit_code
from nodeagent.model.job import Failure, JobRecord
from nodeagent.state import JobState


def record(state: JobState, failure: Failure | None = None) -> JobRecord:
    return JobRecord(
        generation=4,
        state=state,
        reason="",
        target_nodes=1,
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=1,
        max_restarts=0,
        pending_failure=failure,
    )


def failure(kind: str, code: int | None = None, sig: str | None = None) -> Failure:
    return Failure(generation=4, node="n1", rank=2, kind=kind, exit_code=code, signal=sig)


@pytest.mark.parametrize(
    ("state", "pending", "code"),
    [
        (JobState.SUCCEEDED, None, 0),
        (JobState.FAILED, failure("exit_code", 3), 3),
        (JobState.FAILED, failure("exit_code", 300), 1),  # not an exit status: 1
        (JobState.FAILED, failure("signal", None, "SIGKILL"), 1),
        (JobState.FAILED, failure("hang"), 1),
        (JobState.FAILED, None, 1),  # a rendezvous timeout
        (JobState.STOPPED, None, 1),  # an operator's stop: not a success
    ],
)
def test_exit_code(state: JobState, pending: Failure | None, code: int) -> None:
    assert exit_code(record(state, pending)) == code
