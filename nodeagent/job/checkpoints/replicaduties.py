"""The agent's replication duties in its loop, around the node's Replicas (issue 27).

The leader plans every node's copies and writes each node its share (job/checkpoints/handouts.py):
this node reads its own share, never its peers' reports. While the job runs: the copies its share
names, handed to its Replicas, which make them in the background. Before the workers of a generation
restore a memory step: what this node lacks of it, brought from the peers that hold it
(`holds_start`: the workers start once the share of that generation is read and the copies of the
last one ended; their restore waits for the fetch). The listener asks `accept` whether a peer's
request may be served (the listener asks only once the peer proved it is an agent,
checkpoint/peerauth.py): a peer the leader named to this node, connecting from the address it
reports, leaving a save whose digest it reported, or asking for a save the leader's plan has it
fetch from this node (its share's `serves`; nothing else, issue 40).
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from nodeagent.channel import manifests
from nodeagent.checkpoint.replicas import Done, Replicas
from nodeagent.checkpoint.transport import Offer
from nodeagent.config.settings import Config
from nodeagent.coord.bounded import CallRunner
from nodeagent.errors import CoordinationError
from nodeagent.job.checkpoints import lag, replication
from nodeagent.job.checkpoints.dialling import CopyReads, Dialling
from nodeagent.job.checkpoints.handover import Handover
from nodeagent.model.handout import Handout, Served
from nodeagent.model.job import Event, JobRecord, NodeReport
from nodeagent.model.tiers import SaveKey, TierReport
from nodeagent.state import JobState
from nodeagent.telemetry.checkpoints import CheckpointMetrics

log = logging.getLogger(__name__)
# How often this node reads its share: each read is a round trip, some 35 us of Redis CPU
# (bench/copy_plan_read.py), 10,000 nodes reading every second would take a third of a core.
PLAN_S = 1.0  # while its newest save is not committed, or its last share was not all made
IDLE_S = 10.0  # otherwise (a peer's copy to re-protect, planned by the leader meanwhile)
WAIT_READ_S = 0.1  # while the workers wait for the share of their restore: read this often
# After a new save of this node's is verified: its share read at each of the next ticks (the
# report naming the save goes out at the tick that saw it; the leader plans its copies at its
# next round), not a PLAN_S after the last read: that wait was a second of every save's commit
# at a 250 ms heartbeat (docs/benchmarks.md, "Commit latency"). Until the share names them.
# Eight ticks, not three: the leader plans a step's copies once every rank's save is reported,
# and at 240 MB a rank the nodes' verifications ended up to 0.8 s apart; the first to report
# read three times before the plan and then waited a PLAN_S (1.0 s of a 4.3 s commit).
EAGER_TICKS = 8
REFUSED_EVERY_S = 60.0  # a refused request's event, at most this often for one address


@dataclass(frozen=True)
class CopyTerms:
    """What a node's copies are bound by: its name and failure domain (its rack), how many
    copies of a save the job keeps, how long a restore's fetches may take, and how long the
    workers of a generation wait for the share of their restore before they start without it
    (a new leader writes it too)."""

    node: str
    domain: str
    copies: int
    fetch_timeout: float
    share_wait: float

    @classmethod
    def of(cls, config: Config) -> CopyTerms:
        checkpoint = config.job.checkpoint
        return cls(
            node=config.node.name,
            domain=config.pool.labels.get("rack", ""),
            copies=checkpoint.replicas if checkpoint is not None else 0,
            fetch_timeout=config.timing.rendezvous_timeout / 2,
            share_wait=2 * config.timing.lease_ttl,
        )


class ReplicaDuties:
    """What the agent's loop does about the copies of its job's saves (the module docstring)."""

    def __init__(
        self,
        replicas: Replicas,
        store: CopyReads,
        call: CallRunner,
        terms: CopyTerms,
        metrics: CheckpointMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`call` bounds the reads of the agent's loop by its lease (Agent._call); the
        listener's threads read `store` directly, for a request this node cannot check on what
        its loop read (a share of a generation the loop has not read yet, a report newer than
        the one it holds)."""
        self.replicas = replicas
        self._store = store
        self._call = call
        self._node, self._domain, self._k = terms.node, terms.domain, terms.copies
        self._metrics = metrics
        self._fetch_timeout = terms.fetch_timeout
        self._share_wait = terms.share_wait
        self._clock = clock
        # What the listener's threads check requests against (the peers the leader named, the
        # fetches it planned, their reports as read): replaced whole, never changed.
        self._known = _Named(frozenset(), None, {})
        self._last_read = -IDLE_S
        self._pending = False  # the last share read named copies this node had not made
        self._newest_seen: int | None = None  # this node's newest save, as last reported
        self._eager = 0  # ticks left at which the share is read whatever PLAN_S says
        self._made: set[tuple[SaveKey, int, str]] = set()  # copies made: not made again
        self._generation = -1  # the generation whose restore was fetched for (or is being)
        self._waiting: float | None = None  # since when the workers wait for their share
        self._next_wait_read = 0.0
        # Copies wait while this node's workers restore (the restore is the recovery's critical
        # path, and copies beside it compete for the CPU and memory bandwidth), until they said
        # they did or this clock time.
        self._restoring_until = 0.0
        self._behind = False
        self._saves = lag.Saves()  # the newest saves seen, and when: the save interval
        # The committed saves the record named, the one before and the newest: copies older
        # than the one before are removed (`_prune`).
        self._committed: tuple[SaveKey | None, SaveKey | None] = (None, None)
        self._handover = Handover(replicas, terms.node, store, call, terms.fetch_timeout, clock)
        self._dialling = Dialling(store, call)
        self._said_refused: dict[str, float] = {}  # address -> when its last refusal was said

    # -- the listener's threads -------------------------------------------------------------

    def accept(self, offer: Offer) -> str | None:
        """Whether an agent's request may be served (the module docstring); None: yes."""
        named = self._known
        why = self._check(offer, named, named.reports.get(offer.node))
        if why is None:
            return why
        try:  # what this node read may be older than the request: a share of a generation
            # its loop has not read yet (the peer asks at once), a newer report
            if not named.lets(offer):
                share = self._store.handout(self._node)
                if share is not None:
                    named = _Named(frozenset(share.peers), share.serves, named.reports)
            if not named.lets(offer):
                return why
            fresh = self._store.peer_reports([offer.node]).get(offer.node)
        except CoordinationError as exc:
            return f"{why} (and it cannot be read now: {exc})"
        known = {n: r for n, r in named.reports.items() if n in named.peers}
        if fresh is not None:
            known[offer.node] = fresh
        # the loop's next read may replace it: both are current
        self._known = named = _Named(named.peers, named.serves, known)
        return self._check(offer, named, fresh)

    def _check(self, offer: Offer, named: _Named, report: NodeReport | None) -> str | None:
        if offer.node not in named.peers:
            return f"{offer.node} is not a peer the leader named to {self._node}"
        if not named.lets(offer):
            want = offer.want
            assert want is not None
            return (
                f"the leader's plan does not have {offer.node} fetch rank {want.rank} of step "
                f"{want.step}@{want.generation} from {self._node}"
            )
        if report is None or report.tier is None:
            return f"no report of {offer.node} read yet"
        if not _same_host(report.address, offer.host):
            return (
                f"{offer.node} reports address {report.address}, the request came from {offer.host}"
            )
        manifest = offer.manifest
        if manifest is None:
            return None  # a fetch the plan names
        key = (manifest.step, manifest.generation, manifest.world_size)
        digest = replication.digest_of(report, key, manifest.rank)
        if digest is None or digest != manifests.digest(manifest):
            return (
                f"step {manifest.step}@{manifest.generation} rank {manifest.rank} is not a save "
                f"{offer.node} reported holding"
            )
        return None

    # -- the agent's loop -------------------------------------------------------------------

    def report(self, tiers: TierReport) -> TierReport:
        self._handover.reported(tiers)
        return replace(
            tiers,
            replicas=self.replicas.held(),
            address=self.replicas.address,
            domain=self._domain,
        )

    def tick(self, record: JobRecord | None, own: TierReport) -> list[Event]:
        """One pass: what finished, and the copies of this node's share when due; the events
        to publish."""
        events = self._finished(record) + self._turned_away(record)
        checkpoint = record.checkpoint if record is not None else None
        if record is None or checkpoint is None or record.state is not JobState.RUNNING:
            return events
        committed, newest = checkpoint.committed, own.newest_memory()
        self._metrics.lag(newest, committed[0] if committed else None)
        events += self._lagging(record, own)  # while copies are under way too: when it matters
        fresh = newest is not None and newest != self._newest_seen
        if fresh:  # its report goes out with this tick's heartbeat: no share names it yet
            self._newest_seen, self._eager = newest, EAGER_TICKS
        if fresh or self._node not in record.members or self.replicas.busy:
            return events  # a fetch or copies under way: the next read once they ended
        now = self._clock()
        behind = committed is None or (newest is not None and newest > committed[0])
        due = self._last_read + (PLAN_S if behind or self._pending else IDLE_S)
        eager = self._eager > 0 and behind
        if now < self._restoring_until or (now < due and not eager):
            return events
        self._eager = self._eager - 1 if eager else 0
        self._last_read = now
        share = self._read_share()
        if share is None or share.generation != record.generation or share.announced:
            return events
        self._named(share)
        wanted = [t for t in share.transfers if not t.fetch]
        self._made &= {(t.key, t.rank, t.target) for t in wanted}
        mine = [t for t in wanted if (t.key, t.rank, t.target) not in self._made]
        self._pending = bool(mine)
        if any(t.key[0] == newest for t in mine):
            self._eager = 0  # the share names the new save's copies: PLAN_S from here
        if committed != self._committed[1]:
            self._committed = (self._committed[1], committed)
        if mine:
            self.replicas.run(mine, self._dialling.addresses(share), record.generation)
        else:
            self._prune(*self._committed)
        return events

    def holds_start(self, record: JobRecord | None) -> bool:
        """Whether this node's workers of `record`'s generation must wait before they start:
        while the copies of the last generation end (cancelled), and, for a restore from
        memory, until this node read its share of the generation (the leader writes it as it
        writes the record; given up on after `share_wait`). Then what the share says to bring
        is brought from the peers as the workers start (given up on after fetch_timeout):
        their restore waits for it (channel/fetching.py), their start (torch imported, the
        model built, the process group joined) does not."""
        checkpoint = record.checkpoint if record is not None else None
        if record is None or checkpoint is None or record.state is not JobState.RUNNING:
            return False
        if self._node not in record.members or record.generation == self._generation:
            return False
        if self.replicas.busy:  # copies of the last generation: let them end first
            self.replicas.cancel()
            return True
        share = None
        if checkpoint.fetches:  # the leader hands out this generation's fetches
            share = self._share_of(record.generation)
            if share is None and self._waiting is not None:
                return True  # not read yet: the leader writes it right after the record
        self._waiting = None
        self._generation = record.generation
        self._restoring_until = self._clock() + self._fetch_timeout
        transfers = [t for t in share.transfers if t.fetch] if share is not None else []
        if share is None or not transfers:
            return False
        log.info("bringing %d saves from peers for the restore", len(transfers))
        deadline = self._clock() + self._fetch_timeout  # what is not brought by then: given up
        self.replicas.run(transfers, self._dialling.addresses(share), record.generation, deadline)
        return False

    def owes_handover(self, record: JobRecord | None, drained: bool) -> bool:
        """This node owes `record`'s announcement the hand-over of its stop save
        (job/checkpoints/handover.py)."""
        return self._handover.owed(record, drained)

    def hand_over(self, record: JobRecord | None, own: TierReport, drained: bool) -> None:
        """One pass of the hand-over, once this node's workers stopped gracefully and its tiers
        settled (`owes_handover` says when the acknowledgement waits for it)."""
        self._handover.step(record, own, drained)

    def remove(self) -> None:
        """The job ended: the replica area goes."""
        self.replicas.remove()

    @property
    def waiting(self) -> bool:
        """The workers wait for this node's share of their restore (the loop polls for it)."""
        return self._waiting is not None

    def _share_of(self, generation: int) -> Handout | None:
        """This node's share of `generation`, read at most every WAIT_READ_S while waiting;
        None while it is not there (`_waiting` set), or once the wait is given up on
        (`_waiting` None)."""
        now = self._clock()
        if self._waiting is None:
            self._waiting, self._next_wait_read = now, now
        if now < self._next_wait_read:
            return None
        self._next_wait_read = now + WAIT_READ_S
        share = self._read_share()
        if share is not None and share.generation == generation and not share.announced:
            self._named(share)
            return share
        if now - self._waiting >= self._share_wait:
            log.warning(
                "no share of the copies handed out for generation %d in %.0fs: its workers "
                "start without bringing what they lack from peers",
                generation,
                now - self._waiting,
            )
            self._waiting = None
        return None

    def _named(self, share: Handout) -> None:
        """What the listener checks requests against from now: the peers `share` names."""
        peers = frozenset(share.peers)
        known = {n: r for n, r in self._known.reports.items() if n in peers}
        self._known = _Named(peers, share.serves, known)
        self._handover.share(share)

    def _read_share(self) -> Handout | None:
        try:
            return self._call(lambda: self._store.handout(self._node), "read the copies")
        except CoordinationError as exc:
            log.info("cannot read this node's share of the checkpoint copies: %s", exc)
            return None

    def restored(self, step: int | None, generation: int) -> None:
        """The workers of `generation` restored `step` (None: the start): copies of steps after
        it saved by earlier generations belong to a timeline the job abandoned (the workers
        drop theirs too) and must never be counted or restored."""
        self._restoring_until = 0.0  # the copies may go on: this node's share read at once
        self._last_read = -IDLE_S
        floor = step if step is not None else -1
        self.replicas.prune(lambda key: not (key[0] > floor and key[1] < generation))

    def _finished(self, record: JobRecord | None) -> list[Event]:
        events = []
        generation = record.generation if record is not None else 0
        for done in self.replicas.take_done():
            self._handover.finished(done)
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

    def _turned_away(self, record: JobRecord | None) -> list[Event]:
        """`checkpoint_plane_refused`: a request the listener turned away (a stranger, a peer
        asking for what the plan does not give it), at most once a minute for one address."""
        events = []
        now = self._clock()
        for refused in self.replicas.take_refused():
            if now < self._said_refused.get(refused.host, -REFUSED_EVERY_S) + REFUSED_EVERY_S:
                continue
            if len(self._said_refused) >= 4096:  # many addresses: forget, never grow
                self._said_refused.clear()
            self._said_refused[refused.host] = now
            claimed = f" claiming to be {refused.node}" if refused.node else ""
            events.append(
                Event(
                    "checkpoint_plane_refused",
                    record.generation if record is not None else 0,
                    self._node,
                    f"a request from {refused.host}{claimed} was refused: {refused.why}",
                    data={"from": refused.host, "claimed": refused.node, "why": refused.why},
                )
            )
        return events

    def _prune(self, before: SaveKey | None, committed: SaveKey | None) -> None:
        """Remove the copies older than the last two committed saves (replication.keeps_copy)."""
        removed = self.replicas.prune(lambda key: replication.keeps_copy(key, before, committed))
        if removed:
            floor = min(k[:2] for k in (before, committed) if k is not None)
            log.info(
                "replica area: removed %d copies older than step %d, the older of the last two "
                "committed",
                len(removed),
                floor[0],
            )

    def _lagging(self, record: JobRecord, own: TierReport) -> list[Event]:
        """`replication_behind`, said once by the first member, when the copies do not keep up
        with the saves (job/checkpoints/lag.py), and `replication_caught_up` once they do."""
        checkpoint = record.checkpoint
        if checkpoint is None or record.group_rank(self._node) != 0:
            return []
        now = self._clock()
        self._saves = self._saves.saw(own.newest_memory(), now)
        committed = checkpoint.committed_step
        why = lag.behind(self._saves, committed, now)
        if (why is not None) == self._behind:
            return []
        self._behind = why is not None
        if why is None:
            return [
                Event(
                    "replication_caught_up",
                    record.generation,
                    self._node,
                    f"step {committed} is committed (on {self._k + 1} nodes)",
                )
            ]
        newest = self._saves.seen[-1][0]
        return [
            Event(
                "replication_behind",
                record.generation,
                self._node,
                f"{why}: a node lost now restores an older step (raise replication.max_rate "
                "or save less often)",
                data={"newest": newest, "committed": committed},
            )
        ]


@dataclass(frozen=True)
class _Named:
    """What the listener checks a request against: the peers the leader named to this node,
    the fetches it planned from it (None: a share that says nothing of them), and the peers'
    reports as read."""

    peers: frozenset[str]
    serves: tuple[Served, ...] | None
    reports: Mapping[str, NodeReport]

    def lets(self, offer: Offer) -> bool:
        """The plan has `offer` made (a push: by a peer named; a fetch: this very one)."""
        if offer.node not in self.peers:
            return False
        want = offer.want
        if want is None or self.serves is None:
            return True
        return (offer.node, want.step, want.generation, want.rank) in self.serves


def _same_host(reported: str, seen: str) -> bool:
    """The request came from the address a node reports: the same address, or one its host name
    resolves to (a name that does not resolve matches nothing)."""
    try:
        peer = ipaddress.ip_address(seen)
    except ValueError:
        return False
    try:
        return ipaddress.ip_address(reported) == peer
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(reported, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return False
    return any(ipaddress.ip_address(info[4][0]) == peer for info in found)


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
