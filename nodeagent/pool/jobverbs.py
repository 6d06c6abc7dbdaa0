"""When a job may be held, released, requeued or scaled. Pure: one rule for nodeagentctl
(pool.auth none: cli/ctl/holding.py, cli/ctl/scale.py) and for the pool leader taking signed
requests (pool/requests.py), so the two say the same thing in the same words.

- `hold JOB`: a pending job (not one held already) is kept from being admitted;
- `release JOB`: a held job may be admitted again;
- `requeue JOB`: a running job is put back in the queue, in its place (its seq), its workers
  stopped with their grace so that they checkpoint; it runs again when admitted again.
Ended jobs and jobs pinned by their nodes' `job:` sections take none of these.
- `scale JOB N|+N|-N`: a new target within the job's [min_nodes, max_nodes] (scale_plan).
"""

from __future__ import annotations

from typing import Protocol

from nodeagent.model.pool import PoolJob, PoolJobState

VERBS = ("hold", "release", "requeue")


def refusal(verb: str, job_id: str, status: PoolJob, held_by: str | None) -> str | None:
    """Why `verb` cannot be done to the job now (None: it can)."""
    state = status.state
    if verb not in VERBS:
        return f"expected one of {', '.join(VERBS)}, got {verb[:32]!r}"
    if status.pinned:
        return f"job {job_id} comes from its nodes' job: sections: {verb} is for submitted jobs"
    if state.ended:
        return f"job {job_id} has ended already ({state.value}); submit it again to run it again"
    if verb == "hold" and state is not PoolJobState.PENDING:
        return (
            f"job {job_id} is {state.value}: hold keeps a pending job from being admitted; "
            f"`nodeagentctl requeue {job_id}` puts a running one back in the queue"
        )
    if verb == "hold" and held_by is not None:
        return f"job {job_id} is held already (by {held_by})"
    if verb == "release" and held_by is None:
        return f"job {job_id} is not held"
    if verb == "requeue" and state is not PoolJobState.RUNNING:
        return f"job {job_id} is {state.value}: it is in the queue already"
    return None


def done(verb: str, job_id: str, by: str) -> str:
    """What is said once `verb` is asked."""
    if verb == "hold":
        return f"job {job_id}: held by {by}; `nodeagentctl release {job_id}` lets it go"
    if verb == "release":
        return f"job {job_id}: released by {by}"
    return (
        f"job {job_id}: requeue requested by {by}: its workers get the stop grace, then it "
        "waits in its place in the queue"
    )


def stop_refusal(job_id: str) -> str:
    """Why `stop` of a submitted job is refused: what `stop` means for a pinned job (its
    workers stop until `restart`) would end a pool job; these verbs say what is meant."""
    return (
        f"job {job_id} was submitted to the pool: `nodeagentctl cancel {job_id}` ends it, "
        f"`nodeagentctl requeue {job_id}` stops it and puts it back in the queue (stop is for "
        "a job pinned by its nodes' job: sections, until `restart`)"
    )


def relative_target(value: str, current: int) -> int | None:
    """N, or Arena's relative +K / -K from the current target; None: not a whole number."""
    text = value.strip()
    sign = text[:1] if text[:1] in "+-" else ""
    digits = text[1:] if sign else text
    if not digits.isdigit():
        return None
    number = int(digits)
    return current + number if sign == "+" else current - number if sign == "-" else number


def scale_target(job_id: str, value: str, current: int, low: int, high: int) -> int | str:
    """The target `value` names for a job at target `current` with bounds [low, high], or why
    it cannot be one."""
    target = relative_target(value, current)
    if target is None:
        return f"scale: expected N, +N or -N, got {value[:32]!r}"
    if not low <= target <= high:
        return (
            f"cannot scale job {job_id} to {target}: the target must be within "
            f"[min_nodes, max_nodes] = [{low}, {high}]"
        )
    return target


class Sized(Protocol):
    """A job's bounds and target as a record (model/job.JobRecord), a spec's job or a pinned
    job's config (config/settings.JobConfig) gives them."""

    @property
    def min_nodes(self) -> int: ...
    @property
    def max_nodes(self) -> int: ...
    @property
    def target_nodes(self) -> int: ...


def scale_plan(
    job_id: str, value: str, pending: bool, record: Sized | None, submitted: Sized | None
) -> tuple[int, int] | str:
    """(the current target, the new one) of `scale JOB value`, or why not. A pending job
    (never run, or requeued) is scaled in its spec: `submitted` says its bounds and target. A
    job that formed is scaled through its record, which says them as it runs (a scale since
    may have moved the target its spec or config gave); before that, as submitted. Neither
    known: it cannot be scaled yet."""
    sized = record if record is not None else submitted
    if pending and submitted is not None:
        sized = submitted
    if sized is None:
        return f"job {job_id} has not formed yet: nothing to scale"
    current = sized.target_nodes
    target = scale_target(job_id, value, current, sized.min_nodes, sized.max_nodes)
    return target if isinstance(target, str) else (current, target)
