"""What a single-job agent (`nodeagent launch`, `nodeagent run` with an embedded Redis) exits
with once its job has ended, as torchrun does: 0 when the job succeeded; when it failed, the
failing rank's exit code, or 1 (a signal, a hang, a rendezvous timeout, an operator's stop).
"""

from __future__ import annotations

from nodeagent.model import JobRecord
from nodeagent.state import JobState

FAILED = 1


def exit_code(record: JobRecord) -> int:
    """The process exit code for a job record in a terminal state."""
    if record.state is JobState.SUCCEEDED:
        return 0
    failure = record.pending_failure
    if failure is not None and failure.kind == "exit_code" and failure.exit_code:
        return failure.exit_code if 0 < failure.exit_code < 256 else FAILED
    return FAILED
