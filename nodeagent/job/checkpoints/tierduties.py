"""The agent's checkpoint duties in its loop, around the node's TierKeeper (nodeagent.checkpoint).

Each tick: let the keeper start what is due; when this node's workers of a generation have all
ended, have it settle (verify their last saves, and copy the newest to the persistent tier when
they stopped for a reason that is not a failure); turn what the workers say they restored into
events and metrics; remove the memory tier once the job has ended.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from nodeagent.channel.pin import Pin
from nodeagent.channel.restore import RestoreReport
from nodeagent.checkpoint.keeper import Look, TierKeeper
from nodeagent.checkpoint.replicas import Replicas
from nodeagent.config.settings import Config
from nodeagent.coord.bounded import CallRunner
from nodeagent.job.checkpoints import replication, restore
from nodeagent.job.checkpoints.dialling import CopyReads
from nodeagent.job.checkpoints.replicaduties import CopyTerms, ReplicaDuties
from nodeagent.model.job import Event, JobRecord
from nodeagent.model.tiers import TierReport
from nodeagent.state import JobState
from nodeagent.supervisor.spec import WorkerSpec, restore_report_path
from nodeagent.supervisor.status import GroupStatus
from nodeagent.telemetry.checkpoints import CheckpointMetrics

log = logging.getLogger(__name__)


def tier_duties(
    config: Config,
    keeper: TierKeeper,
    replicas: Replicas | None,
    store: CopyReads,
    call: CallRunner,
    metrics: CheckpointMetrics,
    clock: Callable[[], float] = time.monotonic,
) -> TierDuties:
    """The duties of `config`'s job about its tiers on this node (`keeper`, prepared), with its
    copies to peers where the job keeps some and `replicas`, its replica area, is prepared:
    its listener then asks the duties whom to serve. `call` bounds the loop's reads of `store`
    by the agent's lease."""
    checkpoint = config.job.checkpoint
    copies = None
    if replicas is not None and checkpoint is not None and checkpoint.replicas:
        copies = ReplicaDuties(replicas, store, call, CopyTerms.of(config), metrics, clock)
        replicas.listen(copies.accept)
    return TierDuties(keeper, config.node.name, metrics, copies)


class TierDuties:
    """What the agent's loop does about its job's tiers each tick (the module docstring)."""

    def __init__(
        self,
        keeper: TierKeeper,
        node: str,
        metrics: CheckpointMetrics,
        copies: ReplicaDuties | None = None,
    ) -> None:
        self.keeper = keeper
        self.copies = copies
        self._node = node
        self._metrics = metrics
        self._settled: int | None = None  # the generation whose workers' end was settled
        self._graceful = False  # the last stop asked of the workers was not for a failure
        self._newest = 0  # the newest step held anywhere, as the leader said
        self._notes: list[RestoreReport] = []
        self._generation = 0
        self._offered: tuple[str, int] | None = None  # the restore's first source, its step
        self._look: Look | None = None  # the keeper's, as the last report saw it

    @property
    def settling(self) -> bool:
        return self.keeper.settling

    def holds_back(
        self, group: GroupStatus, record: JobRecord | None = None, drained: bool = False
    ) -> bool:
        """The next generation must wait: a settle is under way, or `group` (as the agent's
        decision sees it) has ended and its settle has not begun yet, or this node owes
        `record`'s announcement the hand-over of its stop save (`drained`: this node is;
        job/checkpoints/handover.py). The group may end between this tick's tier duties and the
        decision; acknowledging then would let the leader choose the restore before this node
        verified (and persisted) its last saves."""
        if self.keeper.removed:
            return False
        ended = group.generation is not None and not group.active
        settling = self.keeper.settling or (ended and group.generation != self._settled)
        handing = self.copies is not None and self.copies.owes_handover(record, drained)
        return settling or (self._graceful and handing)

    def report(self) -> TierReport:
        look = self._look = self.keeper.look()
        report = look.report
        self._metrics.held(
            report.newest_memory(), _newest(report), look.memory_bytes, look.save_blocked_s
        )
        return self.copies.report(report) if self.copies is not None else report

    @property
    def newest_save(self) -> tuple[int, float] | None:
        """The memory tier's newest verified save as the last report saw it: its step and how
        long it held the training step (job/progress.py counts the stalls)."""
        look = self._look
        step = look.report.newest_memory() if look is not None else None
        if look is None or step is None or look.save_blocked_s is None:
            return None
        return step, look.save_blocked_s

    def holds_start(self, record: JobRecord | None) -> bool:
        """The workers of `record`'s generation must wait: the copies of the last one end
        first (job/checkpoints/replicaduties.py; what they restore is brought as they start)."""
        return (
            self.copies is not None and not self.keeper.removed and self.copies.holds_start(record)
        )

    @property
    def hands_over(self) -> bool:
        """This node copies its saves to peers and its workers' last stop was graceful: a stop
        save it may hand to its successors as it leaves (job/checkpoints/handover.py)."""
        return self.copies is not None and self._graceful

    @property
    def awaiting_share(self) -> bool:
        """The workers wait for this node's share of their restore's copies
        (job/checkpoints/replicaduties.py)."""
        return self.copies is not None and self.copies.waiting

    def stopping(self, broken: bool, fence: bool) -> None:
        """The agent asked its workers to stop (`broken`: the generation failed)."""
        self._graceful = not broken and not fence

    def started(self, record: JobRecord, specs: Sequence[WorkerSpec], log_dir: str) -> None:
        job = record.checkpoint
        self._newest = job.newest if job is not None else 0
        step = restore.first_step(job) if job is not None else None
        self._offered = (job.restore[0], step) if job is not None and step is not None else None
        self._generation = record.generation
        self._notes = []
        job_id = specs[0].env["NODEAGENT_JOB_ID"]
        reports = {
            s.rank: restore_report_path(log_dir, job_id, record.generation, s.rank) for s in specs
        }
        self.keeper.started(record.generation, tuple(s.rank for s in specs), reports)
        self._graceful = False

    def tick(
        self, group: GroupStatus, record: JobRecord | None, drained: bool = False
    ) -> list[Event]:
        """One pass (`drained`: this node is); the events to publish."""
        keeper = self.keeper
        if keeper.removed:
            return []
        if record is not None and record.checkpoint is not None:
            keeper.protect(record.checkpoint.persisted_step)
            keeper.pin(_pin(record) if self.copies is not None else None)
        ended = group.generation is not None and not group.active
        if ended and group.generation != self._settled:
            self._settled = group.generation
            keeper.settle(persist=self._graceful or group.succeeded)
        keeper.poll()
        events = []
        for problem in _take(keeper.problems):  # a save that did not verify is not reported
            log.warning("%s", problem)
            events.append(
                Event(
                    "checkpoint_refused", self._generation, self._node, f"by the agent: {problem}"
                )
            )
        for problem in _take(keeper.slow):
            log.warning("checkpoint tiers: %s", problem)
            events.append(Event("checkpoint_slow", self._generation, self._node, problem))
        events += self._restored(keeper.restores())
        if record is not None and _committed_here(record):
            keeper.drop_other_ranks()
        if self.copies is not None:
            own = keeper.report()
            events += self.copies.tick(record, own)
            settled = ended and group.generation == self._settled and not keeper.settling
            if self._graceful and settled:  # holds_back() says when the hand-over is owed
                self.copies.hand_over(record, own, drained)
        done = keeper.take_persisted()
        if done is not None:
            self._metrics.persisted(done.seconds, done.bytes)
            events.append(
                Event(
                    "checkpoint_persisted",
                    generation=self._generation,
                    node=self._node,
                    message=f"step {done.held.step} of ranks {_ranks(done.held.ranks)} copied "
                    f"to the persistent tier ({done.bytes:,} bytes, {done.seconds:.2f}s)",
                    data={"step": done.held.step, "ranks": list(done.held.ranks)},
                )
            )
        if (
            record is not None
            and record.state.terminal
            and not group.active
            and not keeper.settling
        ):
            keeper.remove()
            if self.copies is not None:
                self.copies.remove()
            log.info("job %s: memory tier %s removed", record.state.value, keeper.memory)
        return events

    def _restored(self, notes: list[RestoreReport]) -> list[Event]:
        events = []
        for note in notes:
            lost = self._newest - note.step if note.step is not None else None
            bad = [r for r in note.refused if r.worth_an_event]
            self._metrics.restored(note.tier, note.seconds, lost, len(bad))
            for refusal in bad:
                events.append(
                    Event(
                        "checkpoint_refused",
                        generation=self._generation,
                        node=self._node,
                        message=f"rank {note.rank} did not restore from {refusal.source}: "
                        f"{refusal.reason}",
                        data={
                            "rank": note.rank,
                            "source": refusal.source,
                            "kind": refusal.kind.value,
                        },
                    )
                )
        self._notes += notes
        if notes and not self.keeper.expecting:  # every local rank has said
            first = self._notes[0]
            if self.copies is not None:
                self.copies.restored(first.step, self._generation)
            where = f"step {first.step} from the {first.tier} tier" if first.step else "the start"
            slowest = max(n.seconds for n in self._notes)
            lost = self._newest - first.step if first.step is not None else None
            ranks = _ranks(tuple(n.rank for n in self._notes))
            events.append(
                Event(
                    "checkpoint_restored",
                    generation=self._generation,
                    node=self._node,
                    message=f"ranks {ranks} restored {where} in {slowest:.2f}s"
                    + (f" ({lost} steps behind the newest save)" if lost else ""),
                    data={
                        "tier": first.tier,
                        "step": first.step,
                        "steps_lost": lost,
                        "saves": max(n.saves for n in self._notes),  # the most a rank read
                    },
                )
            )
            events += self._fell_back(first, where)
        return events

    def _fell_back(self, first: RestoreReport, where: str) -> list[Event]:
        """`checkpoint_fallback` when the ranks restored an older step than the one the leader
        offered first (a copy refused, a fetch that failed): the steps between are lost."""
        if self._offered is None:
            return []
        source, offered = self._offered
        if first.step is not None and first.step >= offered:
            return []
        reasons = list(
            dict.fromkeys(f"{r.source}: {r.reason}" for n in self._notes for r in n.refused)
        )
        why = "; ".join(reasons[:3]) or "no reason reported"
        message = f"restored {where}, not step {offered} ({source}) offered first: {why}"
        log.warning("%s", message)
        data = {"offered": offered, "source": source, "step": first.step, "tier": first.tier}
        return [Event("checkpoint_fallback", self._generation, self._node, message, data=data)]


def _pin(record: JobRecord) -> Pin | None:
    """What this node's slots keep (channel/pin.py): the committed save, or, while nothing is,
    the newest (whose copies are under way); nothing where no save can be committed (fewer
    members than copies plus one)."""
    checkpoint = record.checkpoint
    assert checkpoint is not None
    if len(record.members) <= checkpoint.replicas:
        return None
    return Pin(checkpoint.committed)


def _newest(report: TierReport) -> int | None:
    return max((h.step for h in report.persisted), default=None)


def _ranks(ranks: tuple[int, ...]) -> str:
    ordered = sorted(ranks)
    if len(ordered) > 2 and ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"{ordered[0]}-{ordered[-1]}"
    return ", ".join(map(str, ordered))


def _take(items: list[str]) -> list[str]:
    taken = list(items)
    del items[: len(taken)]
    return taken


def _committed_here(record: JobRecord) -> bool:
    """A step saved by `record`'s own generation is committed (replication.committed_here):
    the saves of ranks of another world (or that ran elsewhere) are no longer what is whole
    of the newest committed step."""
    committed = record.checkpoint.committed if record.checkpoint is not None else None
    return record.state is JobState.RUNNING and replication.committed_here(
        committed, record.generation, record.world_size
    )
