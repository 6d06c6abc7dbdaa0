"""The agent's replication duties in its loop, around the node's Replicas (issue 27).

While the job runs: when this node holds a new save (or the membership or the committed step
changed), read the members' reports, plan the copies (job/replication.py) and hand this node's
own to its Replicas, which make them in the background. Before the workers of a generation
restore a memory step: bring what this node lacks of it from the peers that hold it
(`holds_start`: the workers start once that is done or given up on). The listener asks
`accept` whether a peer's request may be served: a member of the job, connecting from the
address it reports, leaving a save whose digest it reported, or asking for one.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from nodeagent.channel import tier
from nodeagent.checkpoint.peers import Done, Replicas, Transfer
from nodeagent.checkpoint.replica import Offer
from nodeagent.errors import CoordinationError
from nodeagent.job import replication
from nodeagent.model.job import Event, JobRecord, NodeReport
from nodeagent.model.tiers import Held, SaveKey, TierReport
from nodeagent.state import JobState
from nodeagent.telemetry.checkpoints import CheckpointMetrics

log = logging.getLogger(__name__)
PLAN_S = 1.0  # the least time between two plans (each reads the members' reports)
# Read the members' reports: may raise CoordinationError.
PeerReader = Callable[[Sequence[str]], Mapping[str, NodeReport]]


class ReplicaDuties:
    """What the agent's loop does about the copies of its job's saves (the module docstring)."""

    def __init__(
        self,
        replicas: Replicas,
        node: str,
        domain: str,
        copies: int,
        peers: PeerReader,
        members: Callable[[], Sequence[str]],
        metrics: CheckpointMetrics,
        fetch_timeout: float,
        clock: Callable[[], float] = time.monotonic,
        peers_now: PeerReader | None = None,
        members_now: Callable[[], Sequence[str]] | None = None,
    ) -> None:
        """`peers`: read the members' reports from the agent's loop (bounded by its lease);
        `members`: the record's members, read whole (a node that does not lead is told only
        its own place in them); `peers_now` and `members_now`: the same from the listener's
        threads, for a request from a peer this node has not read as it is now (a member of
        a generation this node's loop has not seen yet, a report older than what it offers).
        Each may raise CoordinationError."""
        self.replicas = replicas
        self._node, self._domain, self._k = node, domain, copies
        self._peers = peers
        self._peers_now = peers_now
        self._members_now = members_now
        self._read_members = members
        self._members: tuple[str, ...] = ()
        self._members_generation = -1
        self._metrics = metrics
        self._fetch_timeout = fetch_timeout
        self._clock = clock
        # What the listener's threads check requests against: replaced whole, never changed.
        self._known: tuple[frozenset[str], Mapping[str, NodeReport]] = (frozenset(), {})
        self._next_plan = 0.0
        self._planned: object = None  # what the last plan with nothing left to do was made from
        self._stale = False  # a request was refused on what this node knew: read again
        self._made: set[tuple[SaveKey, int, str]] = set()  # copies made: not planned again
        self._generation = -1  # the generation whose restore was fetched for (or is being)
        # Copies wait while this node's workers restore (the restore is the recovery's critical
        # path, and copies beside it compete for the CPU and memory bandwidth), until they said
        # they did or this clock time.
        self._restoring_until = 0.0
        self._behind = False

    # -- the listener's threads -------------------------------------------------------------

    def accept(self, offer: Offer) -> str | None:
        members, reports = self._known
        why = self._check(offer, members, reports.get(offer.node))
        if why is None or self._peers_now is None:
            return why
        try:  # what this node read may be older than the request: a generation that added the
            # peer (it asks at once, this node's loop reads at its next tick), a newer report
            if offer.node not in members and self._members_now is not None:
                members = frozenset(self._members_now())
            if offer.node not in members:
                return why
            fresh = self._peers_now([offer.node]).get(offer.node)
        except CoordinationError as exc:
            return f"{why} (and it cannot be read now: {exc})"
        return self._check(offer, members, fresh)

    def _check(
        self, offer: Offer, members: frozenset[str], report: NodeReport | None
    ) -> str | None:
        if offer.node not in members:
            self._stale = True
            return f"{offer.node} is not a member of the job as {self._node} knows it"
        if report is None or report.tier is None:
            self._stale = True
            return f"no report of {offer.node} read yet"
        if not _same_host(report.address, offer.host):
            return (
                f"{offer.node} reports address {report.address}, the request came from {offer.host}"
            )
        manifest = offer.manifest
        if manifest is None:
            return None  # a fetch: a member may read the job's saves
        key = (manifest.step, manifest.generation, manifest.world_size)
        digest = replication.digest_of(report, key, manifest.rank)
        if digest is None or digest != tier.digest(manifest):
            self._stale = True
            return (
                f"step {manifest.step}@{manifest.generation} rank {manifest.rank} is not a save "
                f"{offer.node} reported holding"
            )
        return None

    # -- the agent's loop -------------------------------------------------------------------

    def report(self, tiers: TierReport) -> TierReport:
        return replace(
            tiers,
            replicas=self.replicas.held(),
            address=self.replicas.address,
            domain=self._domain,
        )

    def tick(self, record: JobRecord | None, own: TierReport) -> list[Event]:
        """One pass: what finished, and the next copies when due; the events to publish."""
        events = self._finished(record)
        checkpoint = record.checkpoint if record is not None else None
        if record is None or checkpoint is None or record.state is not JobState.RUNNING:
            return events
        committed = checkpoint.committed
        newest = own.newest_memory()
        self._metrics.lag(newest, committed[0] if committed else None)
        if self._node not in record.members or self.replicas.busy:
            return events  # a fetch or copies under way: the next plan once they ended
        if self._clock() < self._restoring_until:
            return events
        now = self._clock()
        basis = (record.generation, committed, own.memory)
        if now < self._next_plan or (basis == self._planned and not self._stale):
            return events
        self._next_plan, self._stale = now + PLAN_S, False
        members = self._members_of(record)
        nodes = self._read(members) if members else None
        if not members or nodes is None:
            return events
        order = replication.ring(members, {n: t.domain for n, t in _tiers(nodes)})
        wanted = replication.copies(order, nodes, self._k, committed, checkpoint.bad)
        self._made &= {(c.key, c.rank, c.target) for c in wanted}
        mine = [
            Transfer(c.key, c.rank, c.digest, c.sources, c.target)
            for c in wanted
            if c.sources[0] == self._node and (c.key, c.rank, c.target) not in self._made
        ]
        self._planned = None if mine else basis
        if mine:
            self.replicas.run(mine, _addresses(nodes), record.generation)
        else:
            self._prune(committed)
        events += self._lagging(record, own)
        return events

    def holds_start(self, record: JobRecord | None) -> bool:
        """Whether this node's workers of `record`'s generation must wait before they start:
        only while the copies of the last generation end (cancelled). Then what they will
        restore from memory is brought from the peers as they start (given up on after
        fetch_timeout): their restore waits for it (channel/fetching.py), their start (torch
        imported, the model built, the process group joined) does not."""
        checkpoint = record.checkpoint if record is not None else None
        if record is None or checkpoint is None or record.state is not JobState.RUNNING:
            return False
        if self._node not in record.members or record.generation == self._generation:
            return False
        if self.replicas.busy:  # copies of the last generation: let them end first
            self.replicas.cancel()
            return True
        self._generation = record.generation
        self._restoring_until = self._clock() + self._fetch_timeout
        if not any(source.startswith("memory:") for source in checkpoint.restore):
            return False  # nothing to bring: no need to read the peers
        group_rank = record.members.index(self._node)
        nproc = record.nproc_per_node
        local = range(group_rank * nproc, (group_rank + 1) * nproc)
        members = self._members_of(record)
        nodes = self._read(members, self.replicas.held()) if members else None
        if not members or nodes is None:
            return False
        order = replication.ring(members, {n: t.domain for n, t in _tiers(nodes)})
        wanted = replication.fetches(
            self._node, local, record.world_size, checkpoint.restore, order, nodes, self._rows
        )
        if not wanted:
            return False
        log.info("bringing %d saves from peers for the restore", len(wanted))
        transfers = [Transfer(c.key, c.rank, c.digest, c.sources, c.target, True) for c in wanted]
        deadline = self._clock() + self._fetch_timeout  # what is not brought by then: given up
        self.replicas.run(transfers, _addresses(nodes), record.generation, deadline)
        return False

    def _rows(self, key: SaveKey) -> tuple[int, ...] | None:
        """The row counts save `key` records (channel/layout.py), from any rank's manifest on
        this node; None where it holds none, or the save's layout is not row-wise."""
        step, generation, _ = key
        slot = tier.any_save(self.replicas.memory, self.replicas.area, step, generation)
        try:
            return tier.read_manifest(slot).dim0 if slot is not None else None
        except (tier.BadCopy, OSError):
            return None

    def restored(self, step: int | None, generation: int) -> None:
        """The workers of `generation` restored `step` (None: the start): copies of steps after
        it saved by earlier generations belong to a timeline the job abandoned (the workers
        drop theirs too) and must never be counted or restored."""
        self._restoring_until = 0.0  # the copies may go on
        floor = step if step is not None else -1
        self.replicas.prune(lambda key: not (key[0] > floor and key[1] < generation))

    def _members_of(self, record: JobRecord) -> tuple[str, ...]:
        """`record`'s members by name (read once a generation); () when they cannot be read or
        the record read is not `record`'s generation any more (the next tick tries again)."""
        if self._members_generation != record.generation:
            try:
                members = tuple(self._read_members())
            except CoordinationError as exc:
                log.info("cannot read the job's members to copy checkpoints: %s", exc)
                return ()
            mine = record.members.index(self._node)
            if len(members) != len(record.members) or members[mine] != self._node:
                return ()
            self._members, self._members_generation = members, record.generation
        return self._members

    def _read(
        self, members: tuple[str, ...], replicas: tuple[Held, ...] | None = None
    ) -> dict[str, NodeReport] | None:
        """The members' reports, remembered for `accept`; None when Redis cannot be read (the
        next plan tries again). Copies are planned from what this node published (a peer
        accepts only what it can read there); `replicas`: what its replica area holds now,
        for a fetch."""
        try:
            nodes = dict(self._peers(members))
        except CoordinationError as exc:
            log.info("cannot read the peers' reports to copy checkpoints: %s", exc)
            return None
        published = nodes[self._node].tier if self._node in nodes else None
        if replicas is not None and published is not None:
            now = replace(published, replicas=replicas)
            nodes[self._node] = replace(nodes[self._node], tier=now)
        self._known = (frozenset(members), nodes)
        return nodes

    def _finished(self, record: JobRecord | None) -> list[Event]:
        events = []
        generation = record.generation if record is not None else 0
        for done in self.replicas.take_done():
            transfer = done.transfer
            direction = "fetched" if transfer.fetch else "sent"
            self._metrics.copied(direction, done.seconds, done.bytes, done.error is None)
            if done.error is None and not transfer.fetch:
                self._made.add((transfer.key, transfer.rank, transfer.target))
            if done.error is not None:  # a save overwritten before it was sent: saves outpace
                expected = "no longer held" in done.error or "cancelled" in done.error
                level = logging.INFO if expected else logging.WARNING
                log.log(level, "checkpoint copy %s failed: %s", transfer, done.error)
            if done.refused or (done.error is not None and transfer.fetch):
                events.append(_refused_event(done, generation, self._node))
        return events

    def _prune(self, committed: SaveKey | None) -> None:
        if committed is None:
            return
        floor = (committed[0], committed[1])
        removed = self.replicas.prune(lambda key: (key[0], key[1]) >= floor)
        if removed:
            log.info("replica area: removed %d copies older than the committed step", len(removed))

    def _lagging(self, record: JobRecord, own: TierReport) -> list[Event]:
        """`replication_behind`, said once by the first member, when the committed step falls
        more than one save interval behind this node's newest save."""
        checkpoint = record.checkpoint
        if checkpoint is None or record.group_rank(self._node) != 0:
            return []
        steps = sorted({h.step for h in own.memory}, reverse=True)
        if len(steps) < 2:
            return []
        interval, committed = steps[0] - steps[1], checkpoint.committed_step
        behind = committed is None or steps[0] - committed > interval
        if behind == self._behind:
            return []
        self._behind = behind
        if not behind:
            return [
                Event(
                    "replication_caught_up",
                    record.generation,
                    self._node,
                    f"step {committed} is committed (on {self._k + 1} nodes)",
                )
            ]
        return [
            Event(
                "replication_behind",
                record.generation,
                self._node,
                f"the newest step committed on {self._k + 1} nodes is {committed}, more than "
                f"one save interval ({interval} steps) behind step {steps[0]}: a node lost now "
                "restores an older step (raise replication.max_rate or save less often)",
                data={"newest": steps[0], "committed": committed, "interval": interval},
            )
        ]


def _tiers(nodes: Mapping[str, NodeReport]) -> list[tuple[str, TierReport]]:
    return [(n, r.tier) for n, r in nodes.items() if r.tier is not None]


def _addresses(nodes: Mapping[str, NodeReport]) -> dict[str, str]:
    return {n: t.address for n, t in _tiers(nodes) if t.address is not None}


def _same_host(reported: str, seen: str) -> bool:
    """The request came from the address a node reports (names are not resolved: a host name
    reported is taken as it is)."""
    try:
        return ipaddress.ip_address(reported) == ipaddress.ip_address(seen)
    except ValueError:
        return True


def _refused_event(done: Done, generation: int, node: str) -> Event:
    transfer = done.transfer
    step, saved_by, _world = transfer.key
    refused = "; ".join(done.refused)
    what = f"rank {transfer.rank} of step {step}@{saved_by}"
    message = (
        f"{what}: copies refused ({refused}); brought whole from another holder"
        if done.error is None
        else f"{what} could not be brought from a peer: {done.error}"
    )
    return Event(
        "checkpoint_refused",
        generation=generation,
        node=node,
        message=message,
        data={"rank": transfer.rank, "step": step, "source": "replica", "kind": "bad_copy"},
    )
