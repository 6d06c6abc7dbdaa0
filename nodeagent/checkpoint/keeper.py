"""One job's checkpoint tiers on this node, kept by its agent (docs/checkpoints.md).

The agent owns the memory tier (decision 15): it makes the directory before the workers start,
owned by the workers' user, and it outlives every worker and an agent restart; it is removed
when the job ends. The keeper verifies what the workers saved, copies it to the persistent tier
(every `persist_every` saves while they run, and when they stop for a reason that is not a
failure: scale, drain, stop, the end of the job), reports what both tiers hold, and reads the
workers' restore reports. Every slow part (checksums, copies) runs in one background thread;
the agent's loop only polls. While the keeper settles after a stop (verifies, and persists when
asked), the agent does not acknowledge the next generation: the leader chooses the restore from
the reports that follow, so they must be true.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from nodeagent.channel import beneath, manifests, pin, tier
from nodeagent.channel.restore import RestoreReport, read_report
from nodeagent.checkpoint import scan, space
from nodeagent.checkpoint.persistcopy import IN_AGENT, Copier
from nodeagent.config.settings import CheckpointConfig
from nodeagent.model.tiers import MAX_BAD, Held, TierReport

log = logging.getLogger(__name__)
# The memory tier: the workers' user's, the agent's group's by ACL (so is what the workers make
# in it), nobody else's. The agent holds no CAP_DAC_OVERRIDE under its unit.
TIER_MODE = 0o770
KEEP_PERSISTED = 2  # steps of this node's ranks kept in the persistent tier
# The longest a settle holds up the next generation: a persist_dir that hangs (a stuck NFS
# mount) must not stop the job; the copy goes on in the background, and the leader chooses
# from what this node reports then.
SETTLE_TIMEOUT_S = 300.0


class TierPhase(str, Enum):
    """What a node's keeper of one job's tiers is doing for the agent.

    ACTIVE    the workers run (or none yet): their saves are verified as they come, and the
              steps due are copied to the persistent tier in the background.
    SETTLING  a generation's workers stopped (or the agent just started): their last saves are
              being verified, and persisted when they stopped for a reason that is not a
              failure; the node acknowledges no new generation meanwhile. Given up on after
              settle_timeout (back to ACTIVE, the copy goes on).
    REMOVED   the job ended: the memory tier is gone, or goes once a copy under way ends.
    """

    ACTIVE = "active"
    SETTLING = "settling"
    REMOVED = "removed"


PHASE_TRANSITIONS: Mapping[TierPhase, frozenset[TierPhase]] = {
    TierPhase.ACTIVE: frozenset({TierPhase.SETTLING, TierPhase.REMOVED}),
    TierPhase.SETTLING: frozenset({TierPhase.ACTIVE, TierPhase.REMOVED}),
    TierPhase.REMOVED: frozenset({TierPhase.ACTIVE}),  # prepared again (a restarted job)
}


@dataclass(frozen=True)
class Look:
    """What a node's tiers hold, seen once (TierKeeper.look)."""

    report: TierReport
    memory_bytes: int
    save_blocked_s: float | None  # the newest verified save's (the longest local rank's)


@dataclass(frozen=True)
class Persisted:
    held: Held
    seconds: float
    bytes: int


class TierKeeper:
    """This node's tiers of one job. Its methods are called from the agent's loop only; the
    slow work runs in the one background thread it starts at a time, which hands its results
    back under `_lock`."""

    def __init__(
        self,
        config: CheckpointConfig,
        node: str,
        job: str,
        clock: Callable[[], float] = time.monotonic,
        most: int | None = None,
        copier: Copier = IN_AGENT,
    ) -> None:
        """`most`: the bytes one rank's save may take (a manifest naming more is refused
        before a byte of it is read); None: half the tier, what one local rank may take.
        `copier`: where the copies to the persistent tier run (a submitted job's: as its
        user, checkpoint/persistcopy.py)."""
        self.memory = Path(config.memory_tier(node, job))
        self.most = most if most is not None else config.rank_limit(1)
        self._node, self._job = node, job
        self.persist_root = Path(config.persist_dir) if config.persist_dir else None
        self._copier = copier
        self.every = config.persist_every
        # Copies go to peers (job.checkpoint.replicas): every save is verified as it comes, not
        # only those due for the persistent tier, so that it is reported and can be sent.
        self.verify_every_save = config.replicas > 0
        self._clock = clock
        self._verified = scan.Verified(self.memory, most=self.most)
        self._lock = threading.Lock()  # what the thread hands back
        self._thread: threading.Thread | None = None
        self.phase = TierPhase.ACTIVE
        self._settle: bool | None = None  # a settle wanted and not begun: persist or not
        self._settle_began = 0.0
        self.settle_timeout = SETTLE_TIMEOUT_S
        self._thread_settles = False  # the work under way is a settle's
        self._persisted: list[Held] = []
        self._refused: set[int] = set()
        self._ranks: tuple[int, ...] = ()
        self._newest_seen = -1
        self._steps_seen: dict[Path, tuple[scan.Identity | None, int | None]] = {}
        self._expected: dict[int, Path] = {}
        self._protected: int | None = None  # the step the leader records as persisted
        self._pinned: tuple[pin.Pin | None] | None = None  # the pin as written (None: not yet)
        self._reverify = False  # a worker refused a copy: forget what was verified
        self._group = -1  # the workers' group, which reads the persistent tier (-1: the agent's)
        self.last_persist: Persisted | None = None
        self._superseded: tuple[int, int] | None = None  # (step, generation) refused, said once
        self.problems: list[str] = []  # copies that did not verify, for the agent to say
        self.slow: list[str] = []  # settles given up on, for the agent to say

    # -- the agent's calls ------------------------------------------------------------------

    def prepare(self, owner: int | None, group: int | None = None) -> None:
        """Make the memory tier (the workers' user `owner` owns it, the agent's group reads and
        removes what they save, nobody else may enter: space.make_marked), and verify what an
        earlier agent's workers left in it. The steps copied to the persistent tier are the
        workers' group's (`group`) to read.

        Raises: ConfigError naming job.checkpoint.memory_dir and what is wrong."""
        self._group = group if group is not None else -1
        uid = owner if owner is not None else -1
        space.make_marked(self.memory, "the tier", TIER_MODE, self._node, self._job, uid=uid)
        if self.phase is TierPhase.REMOVED:
            self._move(TierPhase.ACTIVE, "prepared again")
        self.settle(persist=False)

    def started(self, generation: int, ranks: tuple[int, ...], reports: Mapping[int, Path]) -> None:
        """The workers of `generation` run `ranks` here; each says what it restored at
        `reports[rank]`."""
        self._ranks = ranks
        self._expected = dict(reports)

    def settle(self, persist: bool) -> None:
        """The workers stopped: verify their last saves and, with `persist`, copy the newest
        step to the persistent tier. `settling` until done."""
        self._settle = bool(persist) or bool(self._settle)
        if self.phase is TierPhase.ACTIVE:
            self._settle_began = self._clock()
            self._move(TierPhase.SETTLING, "persisting" if persist else "verifying")
        self.poll()

    @property
    def removed(self) -> bool:
        return self.phase is TierPhase.REMOVED

    def _move(self, phase: TierPhase, why: str) -> None:
        """Raises: ValueError for a move PHASE_TRANSITIONS does not allow."""
        if phase not in PHASE_TRANSITIONS[self.phase]:
            raise ValueError(f"checkpoint tiers: {self.phase.value} -> {phase.value} ({why})")
        log.debug("checkpoint tiers: %s -> %s (%s)", self.phase.value, phase.value, why)
        self.phase = phase

    @property
    def settling(self) -> bool:
        """A settle is under way and has not outlasted settle_timeout (then it is given up on,
        once, with a problem said: the copy goes on, the generation does not wait for it)."""
        late = self._clock() - self._settle_began > self.settle_timeout
        if self.phase is TierPhase.SETTLING and late:
            self._move(TierPhase.ACTIVE, "settle given up on")
            with self._lock:
                self.slow.append(
                    f"verifying and persisting the last saves took more than "
                    f"{self.settle_timeout:g}s (is {self.persist_root} reachable?); the job goes "
                    "on without waiting for them"
                )
        return self.phase is TierPhase.SETTLING

    def protect(self, step: int | None) -> None:
        """Never prune `step` from the persistent tier: the leader's record names it as the
        newest whole one (a node that persisted newer steps the others did not must not take
        its ranks of it away)."""
        self._protected = step

    def pin(self, wanted: pin.Pin | None) -> None:
        """Tell the workers (and the replica listener) which save no slot may be written over
        (channel/pin.py; None: no pin, nothing kept); written when it changed."""
        if self._pinned == (wanted,) or self.removed or not self.memory.is_dir():
            return
        try:
            if wanted is None:
                (self.memory / pin.FILE).unlink(missing_ok=True)
            else:
                pin.write(self.memory, wanted)
        except OSError as exc:  # the next tick tries again
            log.warning("checkpoint tiers: cannot write %s: %s", self.memory / pin.FILE, exc)
            return
        self._pinned = (wanted,)

    def refuse(self, steps: list[int]) -> None:
        self._refused.update(steps)
        while len(self._refused) > MAX_BAD:  # what a report may carry: the newest
            self._refused.discard(min(self._refused))

    def poll(self) -> None:
        """Start the background work that is due. Cheap: reads a few small manifests."""
        if self._thread is not None and self._thread.is_alive():
            return
        if self._thread is not None:  # it finished
            self._thread = None
            settled = self._thread_settles and self._settle is None
            if settled and self.phase is TierPhase.SETTLING:
                self._move(TierPhase.ACTIVE, "settled")
        if self._reverify:
            self._reverify = False
            self._start(self._work_again, False, False)
            return
        if self._settle is not None:
            persist, self._settle = self._settle, None
            self._start(self._work, persist, True)
            return
        if self.persist_root is not None and self._persist_due():
            self._start(self._work, True, False)
        elif self.verify_every_save and self._verified.pending():
            self._start(self._work, False, False)

    def _start(self, target: Callable[[bool, bool], None], persist: bool, settle: bool) -> None:
        self._thread_settles = settle
        self._thread = threading.Thread(
            target=target, args=(persist, settle), name="nodeagent-tiers", daemon=True
        )
        self._thread.start()

    def _persist_due(self) -> bool:
        """The newest step every local rank saved is one the job's nodes all persist: its
        number of save intervals since step 0 is a multiple of persist_every. Every node
        decides the same from the step alone, so the copies they make are of the same steps
        and add up to whole ones (a count of saves seen would differ from node to node)."""
        steps: dict[int, list[int]] = {}
        for slot, rank in tier.memory_saves(self.memory):
            step = self._step_in(slot)
            if step is not None:
                steps.setdefault(rank, []).append(step)
        ranks = self._ranks or tuple(steps)
        if not ranks or not all(r in steps for r in ranks):
            return False
        newest = min(max(steps[r]) for r in ranks)
        if not all(newest in steps[r] for r in ranks) or newest <= self._newest_seen:
            return False
        self._newest_seen = newest
        pairs = [sorted(steps[r]) for r in ranks if len(steps[r]) == 2]
        interval = pairs[0][1] - pairs[0][0] if pairs else 0
        return interval > 0 and (newest // interval) % self.every == 0

    def _step_in(self, slot: Path) -> int | None:
        """The step of the save in `slot`, its manifest parsed again only when it changed (a
        stat a slot on every tick of the agent's loop, not a read)."""
        ident = scan.identity(slot)
        known = self._steps_seen.get(slot)
        if known is None or known[0] != ident:
            manifest = manifests.manifest_in(slot) if ident is not None else None
            known = self._steps_seen[slot] = (ident, manifest.step if manifest else None)
        return known[1]

    def report(self) -> TierReport:
        return self.look().report

    def look(self) -> Look:
        """What the tiers hold now, from one pass over the verified saves: the report, and the
        memory tier's bytes and the newest save's blocked time for the metrics."""
        with self._lock:
            saves = self._verified.saves()
            report = TierReport(
                memory=scan.held(saves),
                persisted=tuple(self._persisted),
                refused=tuple(sorted(self._refused)),
            )
        newest = max((save.manifest.step for save in saves), default=None)
        blocked = max(
            (s.manifest.blocked_s for s in saves if s.manifest.step == newest), default=None
        )
        return Look(report, sum(save.manifest.size for save in saves), blocked)

    def take_persisted(self) -> Persisted | None:
        """The copy to the persistent tier finished since the last call, if any."""
        with self._lock:
            done, self.last_persist = self.last_persist, None
        return done

    @property
    def expecting(self) -> bool:
        """A local rank of the running generation has not said what it restored yet."""
        return bool(self._expected)

    def restores(self) -> list[RestoreReport]:
        """Reports of local ranks that said what they restored since the last call."""
        notes = []
        for rank, path in list(self._expected.items()):
            note = _read_report(path)
            if note is not None:
                del self._expected[rank]
                notes.append(note)
                self.refuse([s for r in note.refused if (s := r.condemned) is not None])
                if any(r.kind.meaning.verify_again for r in note.refused):
                    self._reverify = True  # a copy here is bad: verify everything again
        return notes

    def drop_other_ranks(self) -> None:
        """Remove the saves of ranks this node no longer runs. Only once a step saved by the
        running generation is committed (the caller says when): until then they may be all
        that is whole of the step it restored (issue 41: removed right after a restore at a
        new world, a crash before the first commit there restored the start)."""
        if self._ranks and not self._expected:
            removed = scan.keep_ranks(self.memory, self._ranks)
            if removed:
                log.info("memory tier: removed ranks %s (run elsewhere now)", removed)

    def remove(self) -> None:
        """The job ended: the memory tier goes, now or, if a copy is under way (a persist_dir
        that hangs), once it ends; the agent's loop never waits for it."""
        if self.phase is not TierPhase.REMOVED:
            self._move(TierPhase.REMOVED, "the job ended")
        thread = self._thread
        if thread is not None and thread.is_alive():
            # Out of the way first, under a name of its own: the node may be placed on the
            # job again (or on a new job of the same id) before the copy returns, and the
            # tier prepared then must not be what this removal deletes.
            doomed = self.memory.with_name(f".{self.memory.name}.removed-{os.getpid()}-{id(self)}")
            try:
                os.rename(self.memory, doomed)
            except OSError:
                doomed = self.memory  # gone already, or cannot be moved: removed in place

            def after_copy() -> None:
                thread.join()
                beneath.remove_tree(doomed)

            threading.Thread(target=after_copy, name="nodeagent-tier-removal", daemon=True).start()
            return
        self._thread = None
        beneath.remove_tree(self.memory)

    # -- the background thread --------------------------------------------------------------

    def _work(self, persist: bool, _settle: bool) -> None:
        try:
            problems = self._verified.refresh()
            if persist and self.persist_root is not None:
                self._persist_newest(self.persist_root)
            with self._lock:
                self.problems += problems
        except Exception as exc:  # the thread must never die silently
            with self._lock:
                self.problems.append(f"checkpoint tiers: {type(exc).__name__}: {exc}")

    def _work_again(self, _persist: bool, _settle: bool) -> None:
        """Verify everything again, from scratch (a worker refused a copy this node offered);
        what is reported meanwhile is what was verified before."""
        fresh = scan.Verified(self.memory, most=self.most)
        problems = fresh.refresh()
        with self._lock:
            self._verified = fresh
            self.problems += problems

    def _persist_newest(self, root: Path) -> None:
        saves = self._verified.saves()
        ranks = self._ranks or tuple(sorted({s.manifest.rank for s in saves}))
        newest = scan.newest_whole(saves, ranks)
        last = newest[0].manifest if newest else None
        if last is None or any(
            (h.step, h.generation) == (last.step, last.generation) for h in self._persisted
        ):  # (not `>=`: after a rollback a newer step of an abandoned timeline was copied)
            return
        began = self._clock()
        before = [scan.identity(save.slot) for save in newest]
        try:
            copied = self._copier.persist(newest, root, self._group, self.most)
        except scan.Superseded as exc:  # a zombie's: its timeline was abandoned
            if self._superseded != (last.step, last.generation):
                self._superseded = (last.step, last.generation)
                log.warning("not persisting: %s", exc)
            return
        except manifests.BadCopy:
            if [scan.identity(save.slot) for save in newest] != before:
                log.info("step %d was replaced while being copied", newest[0].manifest.step)
                return  # the worker saved over it (two newer saves): the next one is copied
            raise
        seconds = self._clock() - began
        # Outside the lock, which the agent's heartbeat takes (look): a slow persist_dir must
        # not hold its loop up. Only this thread writes _persisted.
        kept = self._copier.prune(
            root,
            [*self._persisted, copied],
            KEEP_PERSISTED,
            self._protected,
            copied.ranks,
            copied.generation,
        )
        size = sum(s.manifest.size for s in newest)
        with self._lock:
            self._persisted = kept
            self.last_persist = Persisted(copied, seconds, size)
        log.info(
            "persisted step %d (ranks %s, %d bytes) in %.2fs",
            copied.step,
            list(copied.ranks),
            size,
            seconds,
        )


def _read_report(path: Path) -> RestoreReport | None:
    """A worker's restore report, which the agent trusts no more than any other input
    (channel/restore.py reads it bounded and strictly typed); anything else is said and
    dropped."""
    try:
        return read_report(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("restore report %s unreadable: %s", path, exc)
        path.unlink(missing_ok=True)
        return None
