"""The leader's side of the copies of the job's saves (issue 27): it plans every node's share.

The leader keeps every member's report current anyway (coord/view.py), so it plans the copies
(job/checkpoints/replication.py) for the whole job and writes each node its share (model/handout.py,
coord/handouts.py); a node reads its own field. Planning on every node instead made each read
every member's report once a save, O(members²) reads in all: 23 s of Redis CPU and 9.7 GB sent
per save interval at 4,000 nodes (bench/copy_plan_read.py).

Each round the leader plans from the view it led from, and writes only the shares that changed.
Every member's share names its successors on the ring (where a node that leaves hands over its
stop save, job/checkpoints/handover.py), so every member has one.
A generation whose restore reads the memory tier also gets its fetches, planned once as the
leader first leads it: every member's share is written then (an empty one says "nothing to
bring"), and a node's workers wait for it before their restore. Every share is written again
a minute later at most (what a node read as garbage is replaced), and all of them at a new term.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from nodeagent.coord.bounded import CallRunner
from nodeagent.errors import CoordinationError
from nodeagent.job import members
from nodeagent.job.checkpoints import replication
from nodeagent.job.checkpoints.replication import Copy
from nodeagent.job.port import JobPort
from nodeagent.model.job import JobRecord, NodeReport
from nodeagent.state import JobState

log = logging.getLogger(__name__)
REWRITE_S = 60.0  # every share is written again this often


class Handouts:
    """What the leader writes of the copies, and what it remembers of what it wrote."""

    def __init__(
        self, store: JobPort, replicas: int, call: CallRunner, clock: Callable[[], float]
    ) -> None:
        self._store = store
        self._k = replicas
        self._call = call
        self._clock = clock
        self._token: str | None = None
        self._written: dict[str, str] = {}  # node -> the share written this term
        self._rewrite_at = 0.0
        self._fetches: tuple[int, dict[str, list[Copy]]] = (-1, {})  # a generation's fetches
        self._basis: object = None  # what the shares written were planned from

    def lead(self, token: str, record: JobRecord | None, nodes: Mapping[str, NodeReport]) -> None:
        """One round, as leader (`token`): plan the shares of `record`'s generation from
        `nodes` (the leader's view) and write those that changed."""
        checkpoint = record.checkpoint if record is not None else None
        if not self._k or record is None or checkpoint is None:
            return
        running = record.state is JobState.RUNNING
        if not running and not replication.scaling_down(record):
            return
        now = self._clock()
        reset = token != self._token  # a new term: what another leader wrote goes
        again = reset or now >= self._rewrite_at
        if again:
            self._token, self._basis, self._rewrite_at = token, None, now + REWRITE_S
        live = {name: nodes[name] for name in record.members if name in nodes}
        tiers = [(n, r.tier) for n, r in live.items() if r.tier is not None]
        # A scale-down announced: every member hands its stop save over to the nodes expected
        # to stay (job/checkpoints/handover.py), and nothing else is copied until it runs.
        staying = (
            None
            if running
            else members.next_members(
                record.members,
                members.eligible(live),
                live,
                record.target_nodes,
                record.min_nodes,
            )
        )
        basis = (record.generation, record.state, checkpoint, tiers, staying)
        if basis == self._basis:
            return  # nothing it plans from changed since it wrote
        order = replication.ring(record.members, {n: t.domain for n, t in tiers})
        sends: list[Copy] = []
        fetched: dict[str, list[Copy]] = {}
        if running:
            sends = replication.copies(order, live, self._k, checkpoint.committed, checkpoint.bad)
            fetched = self._fetched(record, order, live)
        after = replication.successors(order, self._k, live, staying)
        shares = replication.handouts(record.generation, live, sends, fetched, after, not running)
        values = {name: share.to_json() for name, share in shares.items()}
        written = {} if reset else self._written
        write = {n: v for n, v in values.items() if again or written.get(n) != v}
        drop = [n for n in written if n not in values]
        if write or drop or reset:
            try:
                self._call(lambda: self._store.hand_out(token, write, drop, reset), "hand out")
            except CoordinationError as exc:  # FencedError too: the next round tries again
                log.info("cannot hand out the copies: %s", exc)
                self._token = None  # unsure what was written: all of it again
                return
        self._written, self._basis = values, basis

    def _fetched(
        self, record: JobRecord, order: Sequence[str], live: Mapping[str, NodeReport]
    ) -> dict[str, list[Copy]]:
        """The fetches of `record`'s generation (`order`: its ring), planned the first time it
        is led: every member gets a share then (an empty one too), which its workers' restore
        waits for."""
        checkpoint = record.checkpoint
        if checkpoint is None or not checkpoint.fetches:
            return {}
        generation, planned = self._fetches
        if generation != record.generation:
            planned = replication.restore_fetches(
                record.members, record.nproc_per_node, checkpoint.restore, order, live
            )
            self._fetches = (record.generation, planned)
            wanted = sum(len(c) for c in planned.values())
            log.info("restore of generation %d: %d saves to bring", record.generation, wanted)
        return planned
