"""The agent's side of its peer watch (job/peerwatch.py): whom to watch, and what it reports.

As a generation runs, the members watch each other (job/suspicion.py): the member list and the
peers' endpoints are read from Redis once a generation (two calls), not at every heartbeat. A
peer this node suspects stays watched while its lease holds, though it is no member any more:
so the leader does not choose it again while it is silent, and a peer that comes back (beats
again, or a new agent on a new endpoint) is cleared. Those reports are read again every lease.

Its beats say what this node's workers are doing (`tell`), and it reads what its peers' say
(`heard`, `out`): what a member riding through a Redis outage goes by (job/ridethrough.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Protocol

from nodeagent.coord.bounded import CallRunner
from nodeagent.errors import CoordinationError
from nodeagent.job import suspicion
from nodeagent.job.peerwatch import Peer
from nodeagent.job.port import JobPort
from nodeagent.job.ridethrough import Beat, Said, narrow, widen
from nodeagent.model.job import Event, JobRecord, NodeReport
from nodeagent.state import JobState

log = logging.getLogger(__name__)
DEPOSE_POLL_S = 0.05  # while it suspects the leader: how often it counts the members' votes


class Watch(Protocol):
    """What the agent needs of its peer watch (job/peerwatch.py's PeerWatch; a fake in tests)."""

    @property
    def port(self) -> int: ...
    @property
    def token(self) -> str: ...
    def watch(self, peers: Iterable[Peer]) -> None: ...
    def suspects(self) -> frozenset[str]: ...
    def tell(self, said: int, bits: int) -> None: ...
    def said(self) -> dict[str, tuple[int, int]]: ...
    def fresh(self, within: float) -> frozenset[str]: ...


class PeerDuties:
    def __init__(
        self,
        watch: Watch,
        name: str,
        store: JobPort,
        call: CallRunner,
        reread_s: float,
        clock: Callable[[], float],
    ) -> None:
        self._watch, self._name, self._store, self._call = watch, name, store, call
        self._reread_s, self._clock = reread_s, clock
        self._generation: int | None = None  # the running generation whose members it watches
        self._members: tuple[str, ...] = ()
        self._watching: tuple[str, ...] = ()
        self._read_at = 0.0
        self._depose_at: float | None = None  # when to count the votes on the leader again
        self.suspects: tuple[str, ...] = ()  # as reported

    @property
    def port(self) -> int:
        return self._watch.port

    @property
    def token(self) -> str:
        return self._watch.token

    def tick(self, record: JobRecord | None) -> list[Event]:
        """Follow the running generation's members; an event when a peer is newly suspected
        (it wakes the leader, whose stream listener sees it at once)."""
        running = record is not None and record.state is JobState.RUNNING
        if running and record is not None and record.generation != self._generation:
            self._follow(record)
        elif self._stale() and self._clock() >= self._read_at + self._reread_s:
            self._read(self._members)
        suspects = tuple(sorted(self._watch.suspects() & set(self._watching)))
        new = [name for name in suspects if name not in self.suspects]
        self.suspects = suspects
        if not new:
            return []
        log.warning("peer watch: %s suspected lost", ", ".join(new))
        message = f"suspects {', '.join(new)}"
        return [Event("peer_suspected", node=self._name, message=message, data={"new": new})]

    def depose(self, leader: str | None) -> bool:
        """Take the leader lease (`leader`: its value as read) when a strict majority of the
        members hold its holder out (job/suspicion.py): a dead or cut-off leader would
        otherwise hold every re-form until its lease lapsed. Only by a member that suspects it
        itself; the votes are counted from the members' reports, again every DEPOSE_POLL_S
        while they do not reach a majority (the others' reports come in their own heartbeats).
        Whether this node now leads."""
        holder = leader.split(" ", 1)[0] if leader else None
        if leader is None or holder in (None, self._name) or holder not in self.suspects:
            self._depose_at = None
            return False
        now = self._clock()
        if self._depose_at is not None and now < self._depose_at:
            return False
        self._depose_at = now + DEPOSE_POLL_S
        members = self._members
        try:
            reports = self._call(lambda: self._store.peer_reports(members), "count the votes")
            if holder not in suspicion.held_out(members, reports):
                return False
            message = f"{holder} held out by a majority of the members: {self._name} leads"
            event = Event("leader_deposed", node=holder, message=message)
            ttl_ms = int(self._reread_s * 1000)
            taken = self._call(
                lambda: self._store.depose(self._name, leader, ttl_ms, event), "depose"
            )
        except CoordinationError as exc:
            log.info("peer watch: cannot take over from %s now: %s", holder, exc)
            return False
        if taken:
            log.warning("peer watch: %s", message)
            self._depose_at = None
        return taken

    def tell(self, beat: Beat) -> None:
        """What this node's beats say from now on."""
        self._watch.tell(beat.said, narrow(beat.generation))

    def watched(self, record: JobRecord) -> tuple[str, ...] | None:
        """The members of `record`'s generation this node watches (None: it has not read
        them for that generation: it cannot tell whom it must hear)."""
        if self._generation != record.generation:
            return None
        return suspicion.watched(self._members, self._name)

    def heard(self, near: int, within: float | None = None) -> dict[str, Beat]:
        """What the watched peers heard and not suspected last said (generations widened
        around `near`); `within`: only those whose last beat came at most that long ago."""
        suspects = self._watch.suspects()
        fresh = self._watch.fresh(within) if within is not None else None
        return {
            name: Beat(_said(state), widen(bits, near))
            for name, (state, bits) in self._watch.said().items()
            if name not in suspects and (fresh is None or name in fresh)
        }

    def out(self, near: int) -> tuple[tuple[str, int], ...]:
        """The peers heard saying their workers of a generation ended, with it (the report's
        `peers_out`)."""
        return tuple(
            sorted(
                (name, beat.generation)
                for name, beat in self.heard(near).items()
                if beat.said is Said.OUT
            )
        )

    @property
    def next_due(self) -> float | None:
        """When the votes on a suspected leader are counted again (None: no such count)."""
        return self._depose_at

    def _stale(self) -> bool:
        """Some watched peer is suspected, or is no member: its report may have moved."""
        return any(n not in self._members for n in self._watching) or bool(self.suspects)

    def _follow(self, record: JobRecord) -> None:
        if self._name not in record.members:
            members: tuple[str, ...] = ()
        else:
            try:
                members = self._call(self._store.members, "read the members")
            except CoordinationError as exc:  # the next tick tries again
                log.info("peer watch: cannot read the members: %s", exc)
                return
        self._generation = record.generation
        self._members = members
        self._read(members)

    def _read(self, members: tuple[str, ...]) -> None:
        names = suspicion.watched(members, self._name) if members else ()
        kept = [n for n in self.suspects if n not in names]
        wanted = (*names, *kept)
        self._read_at = self._clock()
        try:
            found = self._call(lambda: self._store.peer_reports(wanted), "read the peers")
        except CoordinationError as exc:
            log.info("peer watch: cannot read the peers' reports: %s", exc)
            return
        peers = [_peer(found[n]) for n in wanted if n in found and found[n].watch_port]
        # A suspect whose lease lapsed is the leases' business now: no longer watched.
        self._watching = tuple(n for n in names if n in found) + tuple(
            k for k in kept if k in found
        )
        self._watch.watch(p for p in peers if p is not None)


def _said(state: int) -> Said:
    try:
        return Said(state)
    except ValueError:  # a newer agent's word this one does not know
        return Said.UNKNOWN


def _peer(report: NodeReport) -> Peer | None:
    if report.watch_token is None:
        return None
    return Peer(report.name, report.address, report.watch_port, report.watch_token)
