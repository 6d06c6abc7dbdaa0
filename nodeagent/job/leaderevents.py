"""The events the leader's plan (job/plan.py) appends about the job to its event stream. Pure.

Each job event carries the record it was written with: its state, reason, members (the first
EVENT_MEMBERS of them, and how many more: model/history.py reads them back), world size, restart
count and target. Node names in a message are shortened for a large job.
"""

from __future__ import annotations

from collections.abc import Sequence

from nodeagent.job.checkpoints import restore
from nodeagent.model.job import Event, JobRecord
from nodeagent.model.tiers import CheckpointRecord

EVENT_MEMBERS = 64  # members listed in an event's data; a larger job's count is in members_more


def job_event(kind: str, record: JobRecord, message: str) -> Event:
    more = len(record.members) - EVENT_MEMBERS
    return Event(
        kind,
        generation=record.generation,
        message=message,
        data={
            "state": record.state.value,
            "reason": record.reason,
            "members": list(record.members[:EVENT_MEMBERS]),
            **({"members_more": more} if more > 0 else {}),
            "world_size": record.world_size,
            "restart_count": record.restart_count,
            "target_nodes": record.target_nodes,
        },
    )


def restore_event(record: JobRecord, checkpoint: CheckpointRecord) -> Event:
    order = " ".join(checkpoint.restore)
    first = restore.first_step(checkpoint)
    lost = f", {checkpoint.newest - first} steps behind the newest" if first is not None else ""
    return Event(
        "restore_chosen",
        generation=record.generation,
        message=f"restore order {order} (newest step held {checkpoint.newest}{lost})",
        data={
            "restore": list(checkpoint.restore),
            "newest": checkpoint.newest,
            "persisted": checkpoint.persisted_step,
            "bad": list(checkpoint.bad),
        },
    )


def names(nodes: Sequence[str], shown: int = 8) -> str:
    """Node names for a message: all of a small job's, the first few of a large one's (a
    10,000-node job's would be 100 KB in every log line and event)."""
    if len(nodes) <= shown:
        return ", ".join(nodes)
    return f"{', '.join(nodes[:shown])} and {len(nodes) - shown:,} more"
