"""How long each recovery took, phase by phase, from the job's events. Pure.

For a fault injected at `t0` (seconds, same clock as Redis on one machine):
- detection:   t0 -> the event that identifies it (node_lost, worker_failed, worker_hung, ...),
               or the first that notices anything;
- stopping:    -> the last node acknowledging the new generation (every old worker stopped);
- rendezvous:  -> the generation started (members, ranks and master assigned);
- start-up:    -> every rank finished its first training step (from the workers' own logs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from nodeagent.model.job import Event

NOTICED = frozenset(
    {
        "worker_failed",
        "worker_hung",
        "node_lost",
        "node_leaving",
        "node_left",
        "node_fenced",
        "node_joined",
        "generation_announced",
        "scale_requested",
        "restart_requested",
        "stop_requested",
    }
)


@dataclass(frozen=True)
class Recovery:
    fault: str
    injected_at: float
    generation: int | None = None
    world_size: int | None = None
    detection_s: float | None = None
    stopping_s: float | None = None
    rendezvous_s: float | None = None
    startup_s: float | None = None

    @property
    def total_s(self) -> float | None:
        parts = (self.detection_s, self.stopping_s, self.rendezvous_s, self.startup_s)
        return None if any(p is None for p in parts) else sum(p for p in parts if p is not None)


def _at(event: Event) -> float:
    return (event.at_ms or 0) / 1000


def recovery(
    fault: str,
    t0: float,
    events: Sequence[Event],
    first_step_at: Mapping[int, float],
    cause: str | None = None,
) -> Recovery:
    """The recovery from one fault. Phases that did not happen (yet) are None.

    `cause` names the event that identifies this fault (node_lost for a lost machine, whose
    peers' collectives fail earlier); by default the first event that notices anything.
    """
    later = [e for e in events if _at(e) >= t0]
    kinds = {cause} if cause else NOTICED
    noticed = next((e for e in later if e.type in kinds), None)
    announced = next((e for e in later if e.type == "generation_announced"), None)
    if noticed is None or announced is None:
        return Recovery(fault, t0)
    since = max(_at(announced), _at(noticed))
    started = next((e for e in later if e.type == "generation_started" and _at(e) >= since), None)
    if started is None or started.generation is None:
        return Recovery(fault, t0, detection_s=_at(noticed) - t0)
    acks = [
        e
        for e in later
        if e.type == "node_ready" and e.generation == started.generation and _at(e) <= _at(started)
    ]
    stopped = max([_at(noticed), *(_at(e) for e in acks)])
    first = first_step_at.get(started.generation)
    return Recovery(
        fault,
        t0,
        generation=started.generation,
        world_size=started.data.get("world_size"),
        detection_s=_at(noticed) - t0,
        stopping_s=stopped - _at(noticed),
        rendezvous_s=_at(started) - stopped,
        startup_s=None if first is None else first - _at(started),
    )
