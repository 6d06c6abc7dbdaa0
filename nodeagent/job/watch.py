"""What an agent watches besides worker exits: progress beats (hangs) and GPU health.

`WorkerWatch.check()` returns findings as plain data (a rank to fail and why, a cordon to set
or lift, events, detection times); the agent executes them, as it does every other decision.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from nodeagent.channel import beats
from nodeagent.channel.beats import Beat
from nodeagent.gpu.health import NodeHealth
from nodeagent.model.job import Cordon, Event, GpuSummary
from nodeagent.supervisor.spec import WorkerSpec
from nodeagent.supervisor.status import GroupPhase, GroupStatus


@dataclass
class Failed:
    local_rank: int
    kind: str  # hang | xid
    code: int | None = None  # the XID
    message: str = ""


@dataclass
class Findings:
    fail: Failed | None = None
    cordon: Cordon | None = None
    uncordon: bool = False
    events: list[Event] = field(default_factory=list)
    detected: list[tuple[str, float]] = field(default_factory=list)  # (kind, seconds)

    @property
    def anything(self) -> bool:
        return bool(self.fail or self.cordon or self.uncordon or self.events)


class WorkerWatch:
    def __init__(self, node: str, hang_timeout_s: float, health: NodeHealth | None) -> None:
        self._node = node
        self._hangs = HangWatch(hang_timeout_s)
        self._health = health
        self._gpus_by_rank: dict[int, tuple[int, ...]] = {}

    # -- what the agent reads -----------------------------------------------------------------

    @property
    def usable_gpus(self) -> tuple[int, ...] | None:
        return self._health.usable if self._health else None

    @property
    def gpu_uuids(self) -> dict[int, str]:
        """Each GPU's UUID by NVML index, as last sampled (empty without monitoring)."""
        if self._health is None:
            return {}
        return {g.index: g.uuid for g in self._health.monitor.snapshot().gpus if g.uuid}

    @property
    def unfit(self) -> str | None:
        return self._health.unfit if self._health else None

    def gpu_summary(self) -> GpuSummary | None:
        return self._health.summary() if self._health else None

    def last_progress(self) -> dict[int, Beat]:
        return self._hangs.last_progress()

    def stretch(self, local_rank: int) -> Stretch | None:
        """What `local_rank` trained in the generation that runs (job/progress.py)."""
        return self._hangs.stretch(local_rank)

    def next_check(self) -> float | None:
        return self._hangs.next_check()

    # -- what the agent tells it ------------------------------------------------------------

    def started(self, specs: Sequence[WorkerSpec], now: float) -> None:
        self._hangs.watch({s.local_rank: s.progress_path for s in specs}, now)
        self._gpus_by_rank = {s.local_rank: s.gpus for s in specs if s.gpus}

    def uncordoned(self, cordon_before: Cordon) -> None:
        if self._health is not None:
            self._health.uncordoned(cordon_before)

    # -- the check --------------------------------------------------------------------------

    def check(
        self, now: float, group: GroupStatus, cordon: Cordon | None, dump: Callable[[int], str]
    ) -> Findings:
        """Hangs first (they fail the group), then GPU verdicts. `dump` captures a rank's stacks."""
        running = group.phase is GroupPhase.RUNNING and group.failure is None
        findings = Findings()
        if running:
            self._check_hangs(now, group, dump, findings)
        if self._health is not None:
            check = self._health.check(cordon, self._gpus_by_rank if running else {})
            findings.events += check.events
            findings.cordon, findings.uncordon = check.cordon, check.uncordon
            if check.fail_rank is not None and findings.fail is None:
                local_rank, xid = check.fail_rank
                findings.fail = Failed(local_rank, "xid", xid, f"application XID {xid} on its GPU")
        return findings

    def _check_hangs(
        self, now: float, group: GroupStatus, dump: Callable[[int], str], findings: Findings
    ) -> None:
        """A rank that beat and then made no progress for hang_timeout has hung."""
        hung = self._hangs.hung(now)
        if not hung:
            return
        local_rank, timeout = hung[0], self._hangs.timeout_s
        stacks = dump(local_rank)
        findings.fail = Failed(local_rank, "hang", None, f"no progress for {timeout:g}s")
        findings.detected.append(("hang", self._hangs.stalled_for(local_rank, now)))
        findings.events.append(
            Event(
                "worker_hung",
                generation=group.generation,
                node=self._node,
                message=f"local rank {local_rank}: no progress for {timeout:g}s",
                data={"local_rank": local_rank, "stacks": stacks[-4000:]},
            )
        )


@dataclass
class _Seen:
    beats: int
    changed_at: float
    last: Beat | None = None
    first: tuple[float, int] | None = None  # when (this clock) its first change was read, step
    finished: bool = False  # it said its training reached its end: never hung after that


@dataclass(frozen=True)
class Stretch:
    """What a rank trained in its generation, as its beats were read (the agent's clock): the
    first change read and its step, the last and its step."""

    first_at: float
    first_step: int
    last_at: float
    last_step: int


class HangWatch:
    """The agent's end: which ranks that have beaten made no progress for `timeout_s`.

    `hung()` reads each rank's file once and keeps the beat, so `last_progress()` (for metrics)
    costs no I/O.
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._files: dict[int, Path] = {}
        self._seen: dict[int, _Seen] = {}

    def watch(self, files: dict[int, Path], now: float) -> None:
        """Start watching a new generation's files (local rank -> path)."""
        self._files = dict(files)
        self._seen = {rank: _Seen(0, now) for rank in files}

    def last_progress(self) -> dict[int, Beat]:
        """The latest beat, as last read by hung(), of each rank that has beaten."""
        return {rank: s.last for rank, s in self._seen.items() if s.last is not None and s.beats}

    def hung(self, now: float) -> list[int]:
        """Read every rank's beat; return the ranks that have beaten at least once and not
        since `timeout_s` (none when hang detection is off)."""
        hung = []
        for rank, path in self._files.items():
            beat = beats.read(path)
            seen = self._seen[rank]
            if beat is not None and beat.beats != seen.beats:
                seen = _Seen(beat.beats, now, beat, seen.first or (now, beat.step))
                self._seen[rank] = seen
            if beat is not None and beat.finished:  # waiting for its exit, or for its peers'
                self._seen[rank] = replace(seen, last=beat, finished=True)
            elif self.timeout_s > 0 and seen.beats > 0 and now - seen.changed_at >= self.timeout_s:
                hung.append(rank)
        return hung

    def stretch(self, rank: int) -> Stretch | None:
        """What `rank` trained since its generation was watched; None: no beat read yet."""
        seen = self._seen.get(rank)
        if seen is None or seen.first is None or seen.last is None:
            return None
        return Stretch(seen.first[0], seen.first[1], seen.changed_at, seen.last.step)

    def stalled_for(self, rank: int, now: float) -> float:
        """Seconds since `rank` last made progress (0 if it never beat)."""
        seen = self._seen.get(rank)
        return now - seen.changed_at if seen is not None and seen.beats else 0.0

    def next_check(self) -> float | None:
        """When a rank that is beating would first count as hung."""
        times = [
            s.changed_at + self.timeout_s
            for s in self._seen.values()
            if s.beats > 0 and not s.finished
        ]
        return min(times) if times and self.timeout_s > 0 else None
