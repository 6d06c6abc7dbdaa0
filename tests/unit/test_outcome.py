"""A single-job agent's exit code from the job's terminal record (nodeagent.job.outcome)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from nodeagent.job.outcome import SingleJob, exit_code
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


@pytest.mark.parametrize(
    ("state", "detail", "message"),
    [
        # A record written before leaders cleared a success's detail: it still names the
        # failure that caused the restart, which is not how the job ended.
        (JobState.SUCCEEDED, "rank 0 on n0 failed (signal SIGABRT)", "job succeeded (completed)"),
        (JobState.FAILED, "rank 2 on n1 failed (exit code 3)", "job failed (rank 2 on n1"),
    ],
)
def test_the_ending_names_how_this_run_ended(state: JobState, detail: str, message: str) -> None:
    single = SingleJob("j")
    running = replace(record(JobState.RUNNING), reason="worker_failed", detail=detail)
    assert single.observe(running) is None
    ended = running.moved_to(state, reason="completed" if state is JobState.SUCCEEDED else "x")
    ending = single.observe(ended)
    assert ending is not None and ending.message.startswith(message), ending
