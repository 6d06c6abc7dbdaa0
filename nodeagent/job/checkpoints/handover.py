"""A node that leaves keeps its last save in memory: it hands its stop save to its successors.

On `nodeagentctl scale 3` the workers of all four nodes save the step they reached as they stop,
into each node's memory tier; on `nodeagentctl drain d` d's workers do, and the others' save
the same step with them (docs/checkpoints.md). The node that leaves holds its ranks of that save
alone, so the new world could not restore it from memory: it went back to the committed step
(steps lost without a persistent tier) or read the persistent tier. Now, once its workers
stopped gracefully and its tiers settled, a node that may leave sends its ranks of that save to
its successors on the ring (its share names them, job/checkpoints/replication.py `successors`) and
waits until they report holding them before it acknowledges the new generation. The leader reads
those reports before the last acknowledgement (coord/view.py reads changes in order), so it finds
the save whole on the members that stay, commits it and restores it (the members bring what they
lack, DCP reshards).

Which nodes hand over: at a scale-down every member (the leader chooses who stays only once all
have acknowledged); at a drain the drained node. Bounded: given up on after `timeout` (the
leader then restores what it finds, as before). Not for a failure: a failure elsewhere stops
the workers too, but a failed rank has no stop save, so the step is not whole anyway and copying
would only delay the recovery.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from nodeagent.checkpoint.replicas import Done, Replicas
from nodeagent.coord.bounded import CallRunner
from nodeagent.errors import CoordinationError
from nodeagent.job.checkpoints import replication
from nodeagent.job.checkpoints.dialling import CopyReads, Dialling
from nodeagent.model.handout import Handout, Transfer
from nodeagent.model.job import JobRecord
from nodeagent.model.tiers import Held, SaveKey, TierReport
from nodeagent.state import JobState

log = logging.getLogger(__name__)
CONFIRM_S = 0.25  # how often the successors' reports are read until they hold the copies
# At a scale-down, how long the share the leader writes with the announcement (the successors
# among the nodes expected to stay) is waited for before the running generation's share is used.
SHARE_WAIT_S = 5.0


def leaving(record: JobRecord, node: str, drained: bool) -> bool:
    """`record` announces a generation that `node`, a member of the running one, may not be
    part of: a scale-down (its member list is still the old one's while it restarts), or `node`
    is drained."""
    if record.state is not JobState.RESTARTING or node not in record.members:
        return False
    return drained or replication.scaling_down(record)


@dataclass
class _Under:
    """A hand-over under way, for the announcement of `generation`."""

    generation: int
    key: SaveKey
    waiting: dict[tuple[int, str], str]  # (rank, successor) -> digest not yet reported there
    started: float
    next_read: float = 0.0


class Handover:
    """This node's hand-over of its stop save as it may leave (the module docstring)."""

    def __init__(
        self,
        replicas: Replicas,
        node: str,
        store: CopyReads,
        call: CallRunner,
        timeout: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`call` bounds the reads of the successors' reports by the agent's lease."""
        self._replicas = replicas
        self._node = node
        self._store = store
        self._call = call
        self._dialling = Dialling(store, call)
        self._timeout = timeout
        self._clock = clock
        self._share: Handout | None = None  # the last share read: its successors, addresses
        self._published: frozenset[SaveKey] = frozenset()  # in the last report built
        self._under: _Under | None = None
        self._handled = -1  # the announcement whose hand-over is done or given up on
        # (announcement, since, next read): the share written with a scale-down's announcement
        self._asked: tuple[int, float, float] | None = None

    def share(self, share: Handout) -> None:
        self._share = share

    def reported(self, tiers: TierReport) -> None:
        """What the agent's heartbeat says this node holds (a successor accepts a copy only of
        a save its sender reported)."""
        self._published = frozenset(h.key for h in tiers.memory)

    def finished(self, done: Done) -> None:
        """A copy ended: one that failed is not waited for."""
        under = self._under
        if under is not None and done.error is not None and done.transfer.key == under.key:
            under.waiting.pop((done.transfer.rank, done.transfer.target), None)

    def owed(self, record: JobRecord | None, drained: bool = False) -> bool:
        """This node owes `record`'s announcement a hand-over not done or given up on yet:
        its acknowledgement waits, from the moment the announcement is read, not only from the
        first step (a drained node's workers stopped and settled before the announcement came,
        and the decision that reads it would acknowledge at once)."""
        return (
            record is not None
            and record.generation != self._handled
            and leaving(record, self._node, drained)
        )

    def step(self, record: JobRecord | None, own: TierReport, drained: bool = False) -> bool:
        """One pass, once this node's workers stopped gracefully and its tiers settled
        (`drained`: this node is): whether its acknowledgement of `record`'s generation must
        still wait."""
        if record is None or record.generation == self._handled:
            return False
        if not leaving(record, self._node, drained):
            return False  # not marked handled: a drain seen later still hands over
        under = self._under
        if under is None or under.generation != record.generation:
            return self._begin(record, own)
        now = self._clock()
        if now - under.started >= self._timeout:
            self._replicas.cancel()
            log.warning(
                "hand-over: step %d not reported by %s after %.0fs: the new world restores "
                "what the members that stay hold",
                under.key[0],
                ", ".join(sorted({t for _, t in under.waiting})),
                now - under.started,
            )
            return self._done(record.generation)
        if self._replicas.busy:
            return True
        if under.waiting and now >= under.next_read:
            under.next_read = now + CONFIRM_S
            self._confirm(under)
        if under.waiting:
            return True
        log.info(
            "hand-over: step %d of this node's ranks is held by its successors (%.2fs)",
            under.key[0],
            now - under.started,
        )
        return self._done(record.generation)

    def _announced_share(self, record: JobRecord) -> bool:
        """At a scale-down: read the share the leader writes with the announcement, whose
        successors are nodes expected to stay (replication.successors `staying`); whether to
        wait for it still. After SHARE_WAIT_S (a leader from before this rule writes none) the
        running generation's share is used."""
        share = self._share
        if not replication.scaling_down(record):
            return False
        if share is not None and share.generation == record.generation:
            return False
        now = self._clock()
        if self._asked is None or self._asked[0] != record.generation:
            self._asked = (record.generation, now, now)
        generation, since, next_read = self._asked
        if now < next_read:
            return True
        self._asked = (generation, since, now + CONFIRM_S)
        try:
            read = self._call(lambda: self._store.handout(self._node), "read the copies")
        except CoordinationError as exc:
            log.info("cannot read this node's share of the hand-over: %s", exc)
            read = None
        if read is not None and read.generation == record.generation:
            self._share = read
            return False
        return now - since < SHARE_WAIT_S

    def _begin(self, record: JobRecord, own: TierReport) -> bool:
        if self._announced_share(record):
            return True
        newest = _newest(own.memory)
        share = self._share
        if newest is None or share is None or not share.successors:
            return self._done(record.generation)
        if newest.key not in self._published:
            return True  # reported at this tick's heartbeat: its successors check against that
        if self._replicas.busy:  # copies of the generation that stopped: they give way
            self._replicas.cancel()
            return True
        now = self._clock()
        waiting = {
            (rank, successor): newest.digests[i] if newest.digests else ""
            for i, rank in enumerate(newest.ranks)
            for successor in share.successors
        }
        under = _Under(record.generation, newest.key, waiting, now)
        self._under = under
        self._confirm(under)  # what the ring's copies brought there already
        transfers = [
            Transfer(newest.key, rank, digest, (self._node,), successor, False)
            for (rank, successor), digest in under.waiting.items()
        ]
        if not transfers:
            return self._done(record.generation)
        log.info(
            "hand-over: copying step %d of ranks %s to %s before acknowledging",
            newest.key[0],
            list(newest.ranks),
            ", ".join(share.successors),
        )
        addresses = self._dialling.addresses(share)
        self._replicas.run(transfers, addresses, record.generation)
        return True

    def _confirm(self, under: _Under) -> None:
        names = sorted({target for _, target in under.waiting})
        try:
            reports = self._call(
                lambda: self._store.peer_reports(names), "read the successors' reports"
            )
        except CoordinationError as exc:
            log.info("cannot read the successors' reports: %s", exc)
            return
        held = replication.holdings(reports).get(under.key, {})
        for (rank, target), digest in list(under.waiting.items()):
            if held.get(rank, {}).get(target) == digest:
                del under.waiting[(rank, target)]

    def _done(self, generation: int) -> bool:
        self._under, self._handled = None, generation
        return False


def _newest(memory: Sequence[Held]) -> Held | None:
    return max(memory, key=lambda h: (h.step, h.generation), default=None)
