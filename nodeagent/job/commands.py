"""The operator's commands (`nodeagentctl scale`, `restart`, `stop`, `signal`) read into the job
record by the leader's plan (job/plan.py), in their stream's order. Pure.

A scale within [min_nodes, max_nodes] moves the record's target and is rejected otherwise; a
signal is written into the record for the workers of its generation; a restart and a stop are
requests the plan acts on. Each command says what became of it as an event.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from nodeagent.model.job import Command, CommandType, Event, JobRecord


@dataclass(frozen=True)
class Requests:
    """What the commands asked of the plan beyond the record."""

    restart: bool = False
    stop: bool = False
    scaled: bool = False


def apply_commands(
    record: JobRecord, commands: Sequence[Command]
) -> tuple[JobRecord, Requests, list[Event]]:
    requests = Requests()
    events: list[Event] = []
    for cmd in commands:
        record = replace(record, command_cursor=cmd.id)
        if cmd.type is CommandType.SCALE:
            target = cmd.target if cmd.target is not None else -1
            if record.min_nodes <= target <= record.max_nodes:
                events.append(
                    Event(
                        "scale_requested",
                        message=f"target {record.target_nodes} -> {target} (by {cmd.by})",
                        data={"from": record.target_nodes, "to": target},
                    )
                )
                record = replace(record, target_nodes=target)
                requests = replace(requests, scaled=True)
            else:
                events.append(
                    Event(
                        "scale_rejected",
                        message=f"target {cmd.target} outside "
                        f"[{record.min_nodes}, {record.max_nodes}] (by {cmd.by})",
                    )
                )
        elif cmd.type is CommandType.RESTART:
            requests = replace(requests, restart=True)
            events.append(Event("restart_requested", message=f"by {cmd.by}"))
        elif cmd.type is CommandType.STOP:
            requests = replace(requests, stop=True)
            events.append(Event("stop_requested", message=f"by {cmd.by}"))
        elif cmd.type is CommandType.SIGNAL and cmd.signal:
            record = replace(
                record, signal=cmd.signal, signal_id=cmd.id, signal_generation=record.generation
            )
            message = f"SIG{cmd.signal} to the workers of generation {record.generation}"
            events.append(Event("signal_requested", message=f"{message} (by {cmd.by})"))
    return record, requests, events
