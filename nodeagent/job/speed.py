"""How fast this node's ranks step, a window at a time, for the leader's slow-node watch.

At each tick the agent hands `SpeedWatch` its ranks' latest beats and their processes; once a
window has passed it returns the node's `NodeSpeed` (model/speed.py), which the agent writes to
the job's speed hash. Per local rank over the window: the steps it made, and per step the
seconds it computed (its marked sections, `progress.compute()`), ran on a CPU and waited for
one (supervisor/usage.py). The node's figure is its slowest rank's: in a synchronous job one
slow rank holds back its whole node.

Why these and not the step time: in synchronous training every rank steps at the pace of the
slowest, so the step time says that the job is slow, never which rank is. What differs is the
rank's own work: the slow rank computes longer (or waits longer for a CPU it is throttled from)
while its peers sleep in the collective, waiting for it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from nodeagent.channel.beats import Beat
from nodeagent.model.job import WorkerInfo
from nodeagent.model.speed import NodeSpeed
from nodeagent.supervisor.status import GroupPhase, GroupStatus
from nodeagent.supervisor.usage import CpuUsage, cpu_usage


@dataclass(frozen=True)
class _Mark:
    """A rank at the start of the window."""

    pid: int
    step: int
    compute_s: float | None
    usage: CpuUsage | None


@dataclass(frozen=True)
class RankSpeed:
    """One rank over one window, per step."""

    steps: int
    step_s: float
    compute_s: float | None
    cpu_s: float | None
    delay_s: float | None

    @property
    def busy_s(self) -> float | None:
        if self.cpu_s is None or self.delay_s is None:
            return None
        return self.cpu_s + self.delay_s


class SpeedWatch:
    def __init__(
        self,
        node: str,
        window_s: float,
        usage: Callable[[int], CpuUsage | None] = cpu_usage,
    ) -> None:
        self._node = node
        self.window_s = window_s
        self._usage = usage
        self._generation: int | None = None
        self._started = 0.0
        self._marks: dict[int, _Mark] = {}
        self._seq = 0

    def tick(
        self,
        now: float,
        group: GroupStatus,
        beats: Mapping[int, Beat],
        workers: Sequence[WorkerInfo],
    ) -> NodeSpeed | None:
        """The node's speed over the window just ended, when one has; else None."""
        if group.phase is not GroupPhase.RUNNING or group.generation is None:
            self._generation, self._marks = None, {}
            return None
        if group.generation != self._generation:  # a new generation: a new first window
            self._generation = group.generation
            self._begin(now, beats, workers)
            return None
        if now - self._started < self.window_s:
            return None
        elapsed, before = now - self._started, self._marks
        self._begin(now, beats, workers)
        ranks = [
            speed
            for local_rank, mark in before.items()
            if (after := self._marks.get(local_rank)) is not None
            and (speed := _rank_speed(mark, after, elapsed)) is not None
        ]
        if not ranks:
            return None
        self._seq += 1
        return _node_speed(self._node, group.generation, self._seq, elapsed, ranks)

    def next_due(self) -> float | None:
        """When the window under way ends (the agent wakes for it, not at its next heartbeat:
        a 2 s window once lasted 2.998 s, and the time to name a slow node with it); None:
        none is under way."""
        return None if self._generation is None else self._started + self.window_s

    def _begin(self, now: float, beats: Mapping[int, Beat], workers: Sequence[WorkerInfo]) -> None:
        self._started = now
        pids = {w.local_rank: w.pid for w in workers if w.pid is not None}
        self._marks = {
            local_rank: _Mark(pid, beat.step, beat.compute_s, self._usage(pid))
            for local_rank, beat in beats.items()
            if (pid := pids.get(local_rank)) is not None
        }


def _rank_speed(before: _Mark, after: _Mark, elapsed: float) -> RankSpeed | None:
    steps = after.step - before.step
    if steps <= 0 or after.pid != before.pid:  # no step, or another process (restarted)
        return None
    compute = _per_step(before.compute_s, after.compute_s, steps)
    if not compute:  # nothing marked in the window: the script does not mark its compute
        compute = None
    cpu = delay = None
    if before.usage is not None and after.usage is not None:
        cpu = _per_step(before.usage.cpu_s, after.usage.cpu_s, steps)
        delay = _per_step(before.usage.delay_s, after.usage.delay_s, steps)
        if cpu is None or delay is None:
            cpu = delay = None
    return RankSpeed(steps, elapsed / steps, compute, cpu, delay)


def _per_step(before: float | None, after: float | None, steps: int) -> float | None:
    if before is None or after is None or after < before:  # a thread took its times away
        return None
    return (after - before) / steps


def _node_speed(
    node: str, generation: int, seq: int, elapsed: float, ranks: Sequence[RankSpeed]
) -> NodeSpeed:
    """The node's slowest rank by its own work: its marked compute when every rank marks it,
    else its CPU time and wait."""
    if all(r.compute_s is not None for r in ranks):
        slowest = max(ranks, key=lambda r: r.compute_s or 0.0)
    else:
        slowest = max(ranks, key=lambda r: r.busy_s or 0.0)
    return NodeSpeed(
        node=node,
        generation=generation,
        seq=seq,
        window_s=round(elapsed, 3),
        steps=slowest.steps,
        step_s=round(statistics.median(r.step_s for r in ranks), 6),
        busy_s=_round(slowest.busy_s),
        cpu_s=_round(slowest.cpu_s),
        delay_s=_round(slowest.delay_s),
        compute_s=_round(slowest.compute_s),
    )


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)
