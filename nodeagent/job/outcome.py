"""What a single-job agent (`nodeagent launch`, `nodeagent run` with an embedded Redis) exits
with once its job has ended, as torchrun does: 0 when the job succeeded; when it failed, the
failing rank's exit code, or 1 (a signal, a hang, a rendezvous timeout, an operator's stop).
"""

from __future__ import annotations

from dataclasses import dataclass

from nodeagent.model.job import JobRecord
from nodeagent.state import JobState

FAILED = 1


def exit_code(record: JobRecord) -> int:
    """The process exit code for a job record in a terminal state (JobRecord.exit_code)."""
    return record.exit_code


@dataclass(frozen=True)
class Ending:
    code: int
    message: str
    error: bool = False  # an earlier run's result, refused


class SingleJob:
    """A single-job agent leaves once the job has ended, like torchrun. A record that was
    already terminal when this agent first saw it belongs to an earlier run of the same job id
    (a shared Redis): that is refused rather than mistaken for this run's result."""

    def __init__(self, job_id: str) -> None:
        self._job = job_id
        self._seen_going = False  # a non-terminal record seen: the job's end is this run's

    def observe(self, record: JobRecord | None) -> Ending | None:
        """The ending, once `record` shows the job ended."""
        if record is None:
            return None
        if not record.state.terminal:
            self._seen_going = True
            return None
        if self._seen_going:
            code = exit_code(record)
            # A success's detail can only be stale (the failure before a restart).
            succeeded = record.state is JobState.SUCCEEDED
            how = record.reason if succeeded else (record.detail or record.reason)
            return Ending(code, f"job {record.state.value} ({how}): leaving, exit code {code}")
        return Ending(
            FAILED,
            f"job {self._job} already ended ({record.state.value}) in this Redis: use another "
            "job id, or `nodeagentctl restart` it",
            error=True,
        )
