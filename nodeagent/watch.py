"""What an agent watches besides worker exits: progress beats (hangs) and GPU health.

`WorkerWatch.check()` returns findings as plain data (a rank to fail and why, a cordon to set
or lift, events, detection times); the agent executes them, as it does every other decision.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from nodeagent.health import NodeHealth
from nodeagent.launch import WorkerSpec
from nodeagent.model import Cordon, Event, GpuSummary
from nodeagent.node import GroupPhase, GroupStatus
from nodeagent.progress import Beat, HangWatch


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
    def unfit(self) -> str | None:
        return self._health.unfit if self._health else None

    def gpu_summary(self) -> GpuSummary | None:
        return self._health.summary() if self._health else None

    def last_progress(self) -> dict[int, Beat]:
        return self._hangs.last_progress()

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
