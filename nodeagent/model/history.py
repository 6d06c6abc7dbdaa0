"""A job's generations and restarts as its events tell them (`nodeagentctl show`). Pure.

Each `generation_started` event names its generation, members (the first EVENT_MEMBERS of
them, and how many more: job/leaderevents.py) and the reason the generation was announced; each
`generation_announced` after the first generation is a restart, by that reason
(model/job.py RestartReason; "other" for text nodeagent did not write, as the metrics count it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nodeagent.model.job import Event, RestartReason


@dataclass(frozen=True)
class Generation:
    number: int
    started_ms: int
    members: tuple[str, ...]
    more: int  # members not named in the event
    reason: str


def generations(events: Sequence[Event]) -> list[Generation]:
    """Every generation that started, in order."""
    found = []
    for event in events:
        if event.type != "generation_started" or event.generation is None:
            continue
        data = event.data
        members = data.get("members", [])
        more = data.get("members_more", 0)
        found.append(
            Generation(
                event.generation,
                event.at_ms or 0,
                tuple(str(m) for m in members) if isinstance(members, list) else (),
                more if isinstance(more, int) else 0,
                str(data.get("reason", "")),
            )
        )
    return found


def restarts_by_cause(events: Sequence[Event]) -> dict[str, int]:
    """How many new generations were announced after the first, by their reason; not the one
    the job failed in instead of starting (its restarts were used up), as `show`'s count."""
    causes: dict[str, int] = {}
    failed = {e.generation for e in events if e.type == "job_failed"}
    for event in events:
        if event.type != "generation_announced" or (event.generation or 0) <= 1:
            continue
        if event.generation in failed:
            continue
        why = RestartReason.of(str(event.data.get("reason", "")))
        reason = why.value if why is not None else "other"
        causes[reason] = causes.get(reason, 0) + 1
    return causes
