"""What the job trained in each generation, said by the node that runs rank 0 (issue 42).

The agent reads its workers' progress beats at every tick (job/watch.py). The node whose group
rank is 0 turns its local rank 0's into two events per generation, on the job's stream, where
the goodput accounting reads them (model/goodput.py, `nodeagentctl show`):

- `training_started`: the first step read in the generation (`step`), `age_ms` before the event
  was made (on the agent's clock: the event's time is Redis', the stream ID);
- `training_stopped`: as the generation's workers stop or are handed the next generation in
  place: the last step read and how long before (`step`, `age_ms`), the steps trained
  (`steps`), and the seconds its saves held the training step (`stalled_s`: each memory-tier save
  of the generation counted once, the longest local rank's; absent without a memory tier).

One node, two events a generation: at 10,000 nodes every node saying so would be 10,000 events a
restart. Without beats (a script that never calls `beat`) there is nothing to say. When the node
running rank 0 is lost, its `training_stopped` never comes: the accounting then ends the
generation's training at the next announcement (docs/observability.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from nodeagent.job.watch import Stretch
from nodeagent.model.job import Event
from nodeagent.supervisor.status import GroupPhase, GroupStatus


@dataclass
class _Said:
    generation: int
    stretch: Stretch
    stalled_s: float = 0.0
    saves: int = 0  # saves counted in stalled_s
    last_save: int = -1  # the step of the last one


class Progress:
    """The node's rank-0 progress events, from what the agent reads at each tick."""

    def __init__(self, node: str) -> None:
        self._node = node
        self._said: _Said | None = None  # a generation whose start was said, not its end yet

    def tick(
        self,
        now: float,
        group: GroupStatus,
        group_rank: int | None,
        stretch: Stretch | None,
        newest_save: tuple[int, float] | None = None,
    ) -> list[Event]:
        """`stretch`: local rank 0's in the generation that runs; `newest_save`: the memory
        tier's newest verified save (step, seconds it held the step), if any."""
        events: list[Event] = []
        said = self._said
        running = group.phase is GroupPhase.RUNNING and group.generation is not None
        if said is not None and (not running or group.generation != said.generation):
            events.append(self._stopped(said, now))
            said = self._said = None
        if not running or group_rank != 0 or stretch is None:
            return events
        assert group.generation is not None
        if said is None:
            said = self._said = _Said(group.generation, stretch)
            events.append(
                Event(
                    "training_started",
                    generation=said.generation,
                    node=self._node,
                    message=f"rank 0 trained step {stretch.first_step}",
                    data={"step": stretch.first_step, "age_ms": _ms(now - stretch.first_at)},
                )
            )
        said.stretch = stretch
        if newest_save is not None:
            step, blocked_s = newest_save
            # a save of this generation (not the one restored), counted once
            if step >= stretch.first_step and step > said.last_save:
                said.saves, said.last_save = said.saves + 1, step
                said.stalled_s += max(0.0, blocked_s)
        return events

    def _stopped(self, said: _Said, now: float) -> Event:
        stretch = said.stretch
        steps = stretch.last_step - stretch.first_step + 1
        data: dict[str, object] = {
            "step": stretch.last_step,
            "age_ms": _ms(now - stretch.last_at),
            "steps": max(steps, 0),
            "trained_s": round(stretch.last_at - stretch.first_at, 3),
        }
        if said.saves:
            data["stalled_s"] = round(said.stalled_s, 3)
        return Event(
            "training_stopped",
            generation=said.generation,
            node=self._node,
            message=f"rank 0 reached step {stretch.last_step}",
            data=data,
        )


def _ms(seconds: float) -> int:
    return max(0, round(seconds * 1000))
