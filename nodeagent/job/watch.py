"""What an agent watches besides worker exits: progress beats (hangs) and GPU health.

Two verdicts of a hang, both on ranks that beat (`nodeagent.worker.beat`):
- **stopped**: no beat for `timing.stopped_timeout` (500 ms) and its process is stopped by a
  signal (state T: SIGSTOP, SIGTSTP). Only the stuck rank itself is ever stopped: its peers,
  blocked in a collective with it, sleep. So it alone is failed, in about half a second, and an
  in_place job replaces it and keeps the survivors (supervisor/release.py kills it: its sockets
  close and the survivors' collective ends at once).
- **no progress**: no beat for `timing.hang_timeout`. A rank stuck while it runs (a deadlock, a
  data loader that never answers) looks from outside like every peer waiting for it. Ranks that
  mark their compute (`nodeagent.worker.compute`) tell the two apart: a rank whose compute
  moved on since its last beat did its own part of the next step and waits on a peer. It is
  given `waiting_grace_s` more, so that the node of the rank it waits for, whose compute did
  not move on, fails that rank first: an in_place job then replaces the stuck rank alone and
  keeps the waiting ones. If every rank waits (a collective that never returns, a network
  fault), each is failed after the grace and the job restarts, as without the marks.

`WorkerWatch.check()` returns findings as plain data (a rank to fail and why, a cordon to set
or lift, events, detection times); the agent executes them, as it does every other decision.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from nodeagent.channel import beats
from nodeagent.channel.beats import Beat
from nodeagent.gpu.health import NodeHealth
from nodeagent.gpu.policy import Device
from nodeagent.job import stalls
from nodeagent.job.accrual import Arrivals
from nodeagent.model.job import Cordon, Event, GpuSummary
from nodeagent.model.stalls import RankStall
from nodeagent.supervisor.spec import WorkerSpec
from nodeagent.supervisor.status import Activity, GroupPhase, GroupStatus

STALL_POLL_S = 0.25  # how often a rank listed as stalled but busy is looked at again


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
    relisted: bool = False  # its stalled ranks changed: the report goes out at once

    @property
    def anything(self) -> bool:
        return bool(self.fail or self.cordon or self.uncordon or self.events or self.relisted)


class WorkerWatch:
    def __init__(
        self,
        node: str,
        hang_timeout_s: float,
        health: NodeHealth | None,
        stopped_timeout_s: float = 0.0,
        waiting_grace_s: float = 0.0,
        waited_phi: float = 0.0,
    ) -> None:
        self._node = node
        self._hangs = HangWatch(
            hang_timeout_s,
            stopped_timeout_s,
            waiting_grace_s=waiting_grace_s,
            waited_phi=waited_phi,
        )
        self.stalls: tuple[RankStall, ...] = ()  # as last reported (job/stalls.py)
        self._health = health
        self._gpus_by_rank: dict[int, tuple[int, ...]] = {}
        self._watching = False  # the group ran, failure-free, at the last check

    # -- what the agent reads -----------------------------------------------------------------

    @property
    def usable_gpus(self) -> tuple[Device, ...] | None:
        """What the workers may be handed, in order: (GPU index, UUID), a MIG instance each of
        a GPU in MIG mode (None: no monitoring)."""
        return self._health.usable if self._health else None

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
        """When the hang check is next due; None while the group does not run (a failed or
        stopped rank is not checked: its last beat's deadline, long past, had the agent's loop
        spinning, heartbeat after heartbeat, for as long as it stayed so; a slow node drained
        from its job, leading it, took 74 % of a CPU and slowed the job it left)."""
        return self._hangs.next_check() if self._watching else None

    # -- what the agent tells it ------------------------------------------------------------

    def started(self, specs: Sequence[WorkerSpec], now: float) -> None:
        self._hangs.watch({s.local_rank: s.progress_path for s in specs}, now)
        self._gpus_by_rank = {s.local_rank: s.gpus for s in specs if s.gpus}

    def uncordoned(self, cordon_before: Cordon) -> None:
        if self._health is not None:
            self._health.uncordoned(cordon_before)

    # -- the check --------------------------------------------------------------------------

    def check(
        self,
        now: float,
        group: GroupStatus,
        cordon: Cordon | None,
        dump: Callable[[int], str],
        stopped: Callable[[int], bool] = lambda local_rank: False,
        activity: Callable[[int], Activity | None] = lambda local_rank: None,
        cpu: Callable[[int], float | None] = lambda local_rank: None,
    ) -> Findings:
        """Hangs first (they fail the group), then GPU verdicts. `dump` captures a rank's stacks;
        `stopped` says whether a rank's process is stopped by a signal; `activity` whether it
        works, `cpu` its CPU time (the stalled ranks listed for the job's leader)."""
        running = self._watching = group.phase is GroupPhase.RUNNING and group.failure is None
        findings = Findings()
        if running:
            self._check_hangs(now, group, dump, stopped, activity, cpu, findings)
        self._relist(group, running, findings)
        if self._health is not None:
            check = self._health.check(cordon, self._gpus_by_rank if running else {})
            findings.events += check.events
            findings.cordon, findings.uncordon = check.cordon, check.uncordon
            if check.fail_rank is not None and findings.fail is None:
                local_rank, xid = check.fail_rank
                findings.fail = Failed(local_rank, "xid", xid, f"application XID {xid} on its GPU")
        return findings

    def _check_hangs(
        self,
        now: float,
        group: GroupStatus,
        dump: Callable[[int], str],
        stopped: Callable[[int], bool],
        activity: Callable[[int], Activity | None],
        cpu: Callable[[int], float | None],
        findings: Findings,
    ) -> None:
        """A rank stopped by a signal, else one that made no progress for hang_timeout, has
        hung (the module docstring)."""
        hangs = self._hangs.hung(now, stopped, activity, cpu)
        if not hangs:
            return
        hang = hangs[0]
        if hang.stopped:  # its stacks would say nothing of who stopped it
            what, stacks = f"stopped by a signal, no progress for {hang.for_s:.2f}s", ""
        else:
            what, stacks = f"no progress for {hang.for_s:.1f}s", dump(hang.local_rank)
            if hang.waiting:
                what += ", waiting on its peers (its own part of the step done)"
        findings.detected.append(("hang", hang.for_s))
        data = {"stopped": hang.stopped, "waiting": hang.waiting}
        self._hung(findings, group, hang.local_rank, what, stacks, data)

    def _hung(
        self,
        findings: Findings,
        group: GroupStatus,
        local_rank: int,
        what: str,
        stacks: str,
        data: dict[str, bool],
    ) -> None:
        """`local_rank` failed as hung, said in a worker_hung event with its stacks."""
        findings.fail = Failed(local_rank, "hang", None, what)
        findings.events.append(
            Event(
                "worker_hung",
                generation=group.generation,
                node=self._node,
                message=f"local rank {local_rank}: {what}",
                data={"local_rank": local_rank, **data, "stacks": stacks[-4000:]},
            )
        )

    def _relist(self, group: GroupStatus, running: bool, findings: Findings) -> None:
        """Its ranks silent past their step times, as the report says them (none unless its
        group runs): a change goes out at once."""
        listed = self._hangs.stalls if running else ()
        if listed != self.stalls:
            self.stalls, findings.relisted = listed, True

    def named(self, group: GroupStatus, local_rank: int, dump: Callable[[int], str]) -> Findings:
        """The job's leader named `local_rank` as the rank every other rank waits on
        (job/stalls.py). If it still is silent past its step times, it has hung: its stacks are
        taken (`dump`) and it is failed."""
        findings = Findings()
        running = group.phase is GroupPhase.RUNNING and group.failure is None
        if not running or local_rank not in {stall.local_rank for stall in self.stalls}:
            return findings
        what = "no progress, asleep while every other rank waits on it (named by the job's leader)"
        data = {"stopped": False, "waiting": False, "waited_on": True}
        self._hung(findings, group, local_rank, what, dump(local_rank), data)
        return findings


@dataclass(frozen=True)
class Hang:
    """A rank found hung: stopped by a signal (it, not a peer, is stuck), or silent for
    hang_timeout; for how long it made no progress; whether it waits on its peers (its compute
    moved on since its last beat)."""

    local_rank: int
    stopped: bool
    for_s: float
    waiting: bool = False


@dataclass
class _Seen:
    beats: int
    changed_at: float
    last: Beat | None = None
    first: tuple[float, int] | None = None  # when (this clock) its first change was read, step
    finished: bool = False  # it said its training reached its end: never hung after that
    asked: float | None = None  # when it was last found silent stopped_s and not stopped
    read_at: float = 0.0  # when its file was last read
    waiting: bool = False  # a compute section ended since its last beat: it waits on a peer
    arrivals: Arrivals = field(default_factory=Arrivals)  # its step intervals (job/stalls.py)
    stall_after: float | None = None  # the silence after which it is listed as stalled
    cpu_at_beat: float | None = None  # its process's CPU seconds as its last beat was read
    asleep: bool = False  # its process did no work when last asked (at sampled_at)
    sampled_at: float | None = None


@dataclass(frozen=True)
class Stretch:
    """What a rank trained in its generation, as its beats were read (the agent's clock): the
    first change read and its step, the last and its step."""

    first_at: float
    first_step: int
    last_at: float
    last_step: int


class HangWatch:
    """The agent's end: which ranks that have beaten made no progress for `timeout_s`, or for
    `stopped_s` while stopped by a signal (0: that verdict off).

    `hung()` reads each rank's file once and keeps the beat, so `last_progress()` (for metrics)
    costs no I/O. A beat is dated on the agent's clock: when it was read, less how old the
    worker's wall time says it is (`wall`: this host's clock, which the worker shares), never
    before the read that did not see it yet. The agent reads the files when it wakes, not at
    every beat, so a beat's read time alone would date it up to a wake too late, and a stopped
    rank would be found that much later.
    """

    def __init__(
        self,
        timeout_s: float,
        stopped_s: float = 0.0,
        wall: Callable[[], float] = time.time,
        waiting_grace_s: float = 0.0,
        waited_phi: float = 0.0,
    ) -> None:
        self.timeout_s, self.stopped_s, self._wall = timeout_s, stopped_s, wall
        self.waiting_grace_s, self.waited_phi = waiting_grace_s, waited_phi
        self._files: dict[int, Path] = {}
        self._seen: dict[int, _Seen] = {}
        self.stalls: tuple[RankStall, ...] = ()  # as listed at the last read (job/stalls.py)

    def watch(self, files: dict[int, Path], now: float) -> None:
        """Start watching a new generation's files (local rank -> path)."""
        self._files = dict(files)
        self._seen = {rank: _Seen(0, now, read_at=now) for rank in files}
        self.stalls = ()

    def last_progress(self) -> dict[int, Beat]:
        """The latest beat, as last read by hung(), of each rank that has beaten."""
        return {rank: s.last for rank, s in self._seen.items() if s.last is not None and s.beats}

    def hung(
        self,
        now: float,
        stopped: Callable[[int], bool] = lambda rank: False,
        activity: Callable[[int], Activity | None] = lambda rank: None,
        cpu: Callable[[int], float | None] = lambda rank: None,
    ) -> list[Hang]:
        """Read every rank's beat; return the ranks that have beaten at least once and not
        since `stopped_s` while `stopped` says their process is stopped, or since `timeout_s`
        (stopped ranks first). `stopped` is asked only of a rank silent that long. Lists the
        ranks silent past their step times (`stalls`): `cpu` (cheap) is asked of a rank as its
        beat is read, `activity` (a walk of the process table) only of a rank silent that long,
        every STALL_POLL_S at most."""
        found = []
        for rank, path in self._files.items():
            beat = beats.read(path)
            seen = self._seen[rank]
            if beat is not None and beat.beats != seen.beats:
                seen = self._moved_on(rank, seen, beat, now, cpu)
            if beat is not None:
                seen.waiting = beat.waiting
            seen.read_at = now
            if beat is not None and beat.finished:  # waiting for its exit, or for its peers'
                self._seen[rank] = replace(seen, last=beat, finished=True)
                continue
            silent = now - seen.changed_at
            if seen.beats == 0:
                continue
            if 0 < self.stopped_s <= silent:
                seen.asked = now  # asked again stopped_s from now (a slow step, a sleeper)
                if stopped(rank):
                    found.append(Hang(rank, True, silent))
                    continue
            if 0 < self.timeout_s <= silent:
                if seen.waiting and silent < self.timeout_s + self.waiting_grace_s:
                    continue  # the node of the rank it waits for fails that one first
                found.append(Hang(rank, False, silent, seen.waiting))
        self._list_stalls(now, activity)
        return sorted(found, key=lambda hang: not hang.stopped)

    def _moved_on(
        self,
        rank: int,
        seen: _Seen,
        beat: Beat,
        now: float,
        cpu: Callable[[int], float | None],
    ) -> _Seen:
        """A rank's new beat, dated (the class docstring); its step interval learnt."""
        age = min(max(0.0, self._wall() - beat.wall_time), now - seen.read_at)
        at = now - age
        moved = _Seen(beat.beats, at, beat, seen.first or (at, beat.step), arrivals=seen.arrivals)
        if self.waited_phi > 0 and seen.beats:
            steps = beat.beats - seen.beats
            for _ in range(min(steps, 10)):  # each step of the stretch at its mean
                moved.arrivals.add((at - seen.changed_at) / steps)
            moved.stall_after = stalls.stall_after(moved.arrivals, self.waited_phi)
            moved.cpu_at_beat = cpu(rank) if moved.stall_after is not None else None
        self._seen[rank] = moved
        return moved

    def _list_stalls(self, now: float, activity: Callable[[int], Activity | None]) -> None:
        """The ranks silent past their step times, each with its last step, whether it waits
        on a peer and whether it is asleep (job/stalls.py)."""
        listed = []
        for rank, seen in self._seen.items():
            if not seen.beats or seen.finished or seen.stall_after is None or seen.last is None:
                continue
            silent = now - seen.changed_at
            if silent < seen.stall_after:
                continue
            if seen.sampled_at is None or now - seen.sampled_at >= STALL_POLL_S:
                seen.asleep = stalls.idle(seen.cpu_at_beat, activity(rank), silent)
                seen.sampled_at = now
            listed.append(RankStall(rank, seen.last.step, seen.waiting, seen.asleep))
        self.stalls = tuple(listed)

    def stretch(self, rank: int) -> Stretch | None:
        """What `rank` trained since its generation was watched; None: no beat read yet."""
        seen = self._seen.get(rank)
        if seen is None or seen.first is None or seen.last is None:
            return None
        return Stretch(seen.first[0], seen.first[1], seen.changed_at, seen.last.step)

    def next_check(self) -> float | None:
        """When a rank that is beating would first count as hung, or is next asked whether it
        is stopped (every stopped_s while it is silent), or would be listed as silent past its
        step times (and, listed busy, every STALL_POLL_S: asleep yet?)."""
        times = []
        asleep = {stall.local_rank: stall.asleep for stall in self.stalls}
        for rank, seen in self._seen.items():
            if not seen.beats or seen.finished:
                continue
            if self.timeout_s > 0:
                grace = self.waiting_grace_s if seen.waiting else 0.0
                times.append(seen.changed_at + self.timeout_s + grace)
            if self.stopped_s > 0:
                times.append((seen.asked or seen.changed_at) + self.stopped_s)
            if seen.stall_after is not None and rank not in asleep:
                times.append(seen.changed_at + seen.stall_after)
            elif asleep.get(rank) is False:
                times.append(seen.read_at + STALL_POLL_S)
        return min(times, default=None)
