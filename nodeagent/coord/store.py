"""JobStore: the job's state in Redis, read and written through the scripts in scripts.py.

Turns Redis replies into model objects (coord/replies.py) and Redis failures into
CoordinationError / FencedError. Nothing read is trusted: values that are not what nodeagent
writes are reported once (GarbageLog: a log line, a count, an event) and ignored, or repaired by
the leader; a corrupt job record is returned as `record=None` with `record_error` set, so the
leader rewrites it from what the nodes remember; a corrupt node report makes that node count as
absent. A key of the wrong type is a CorruptStateError naming it, never "cannot reach Redis".

What this node acts on is checked against what it knows itself by the job's rule (`check`, set
by the agent: job/verify.py), before the garbage it finds is reported.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

import redis

from nodeagent.coord import scripts, streams
from nodeagent.coord.cordons import lift_cordon, put_cordon
from nodeagent.coord.errors import redis_errors
from nodeagent.coord.handouts import CopiesHash
from nodeagent.coord.keys import COMMANDS_MAXLEN, EVENTS_MAXLEN, WAKE_MAXLEN, JobKeys
from nodeagent.coord.lua import Call
from nodeagent.coord.replies import (
    HeldRecord,
    NodeLease,
    Snapshot,
    check_forged,
    parse_snapshot,
    read_lease,
)
from nodeagent.coord.scripts import leave_call, read_page_call
from nodeagent.coord.speeds import SpeedHashes
from nodeagent.coord.view import PAGE, SWEEP, LeaderView, ViewRead, sweep_all
from nodeagent.errors import CoordinationError, CorruptStateError
from nodeagent.model.garbage import Garbage, GarbageLog
from nodeagent.model.handout import Handout
from nodeagent.model.job import (
    Command,
    Cordon,
    Event,
    JobRecord,
    NodeReport,
)
from nodeagent.model.speed import NodeSpeed, SlowVerdict

__all__ = ["JobStore", "NodeLease", "Snapshot"]
log = logging.getLogger(__name__)
RANKS_PAGE = 1000  # names a WRITE_RANKS call writes: 1-2 ms of Redis, the first 3-5 (reform_read)


# A heartbeat's snapshot -> what the node named may act on (and the garbage found checking it).
SnapshotCheck = Callable[[Snapshot, str], Snapshot]


def _as_read(snapshot: Snapshot, me: str) -> Snapshot:
    return snapshot


class RecordWrite(Protocol):
    """What a leader writes in one fenced commit (job/plan.py's Plan is one): the record (None:
    unchanged), events to append, nodes to reap, garbage leases to drop (member, score read)."""

    @property
    def record(self) -> JobRecord | None: ...
    @property
    def events(self) -> tuple[Event, ...]: ...
    @property
    def reap(self) -> tuple[str, ...]: ...
    @property
    def drop(self) -> tuple[tuple[str, str], ...]: ...


class JobStore:
    """One job's keys in one Redis, for one agent or one nodeagentctl."""

    def __init__(
        self, client: redis.Redis, keys: JobKeys, garbage: GarbageLog | None = None
    ) -> None:
        self.client = client
        self.keys = keys
        self.garbage = garbage or GarbageLog()
        # What this node may act on, decided by the job (job/verify.py's RecordCheck); applied
        # to every heartbeat's snapshot before its garbage is reported.
        self.check: SnapshotCheck = _as_read
        # A value that is not UTF-8 must read as garbage, not fail every reply that holds it.
        kwargs = getattr(client.connection_pool, "connection_kwargs", None)
        if isinstance(kwargs, dict):
            kwargs.setdefault("encoding_errors", "replace")
        self._view: LeaderView[NodeReport] = LeaderView()  # what it read while it leads
        self.last_read = 0  # reports read by the leader's last heartbeat, every page of it
        self.last_pages = 0  # and the calls it took
        self._held: HeldRecord | None = None  # the record as last read, not sent again
        self._sync = scripts.SYNC.bind(client)
        self._snapshot = scripts.SNAPSHOT.bind(client)
        self._page = scripts.READ_PAGE.bind(client)
        self._commit = scripts.COMMIT.bind(client)
        self._write_ranks = scripts.WRITE_RANKS.bind(client)
        self._leave = scripts.LEAVE.bind(client)
        self._depose = scripts.DEPOSE.bind(client)
        self._copies = CopiesHash(client, keys)
        self._speeds = SpeedHashes(client, keys)

    def sync(self, report: NodeReport, events: Sequence[Event] = ()) -> Snapshot:
        """Heartbeat: renew the lease, take or keep the leader lease, append events, read.

        The leader gets the whole cluster (leases, reports, new commands); others the record.
        Garbage read is reported once (self.garbage), with its events sent on a later heartbeat.
        """
        pending = self.garbage.take_events()
        call = self.sync_call(report, [*events, *pending])
        try:
            with redis_errors("heartbeat"):
                reply = self._sync(call)
            snapshot = parse_snapshot(self.keys, reply, self._held, report.name)
            held = snapshot.held
            if held is not None and held.head and held.error:
                # garbage where the record's head should be: this node reads the whole record
                whole = [*reply[:3], self._whole_record(), *reply[4:]]
                snapshot = parse_snapshot(self.keys, whole, None, report.name)
                snapshot = replace(snapshot, garbage=(*held.garbage, *snapshot.garbage))
            if snapshot.leader_name == report.name:
                snapshot = self._read_on(snapshot)
            else:
                self._view = LeaderView[NodeReport]()
        except CoordinationError:
            self.garbage.put_back(pending)
            raise
        self._held = snapshot.held
        snapshot = self.check(snapshot, report.name)
        self.garbage.node = report.name
        self.garbage.observe(snapshot.garbage, leading=snapshot.leader_name == report.name)
        return snapshot

    def _whole_record(self) -> str | None:
        with redis_errors("read the job record"):
            raw = self.client.hget(self.keys.record, "record")
        return raw if isinstance(raw, str) else None

    def _read_on(self, snapshot: Snapshot) -> Snapshot:
        """The leader's snapshot with its kept view: the pages after SYNC's first one are read
        before it plans (each a bounded READ_PAGE call), and every lease known is in it."""
        view = self._view
        garbage, drop = list(snapshot.garbage), list(snapshot.drop)

        def more(cursor: int, expired: int) -> ViewRead[NodeReport]:
            page = self._read_page(cursor, "", SWEEP, expired)
            garbage.extend(page.garbage)
            drop.extend(page.drop)
            return page.view_read()

        self.last_read, self.last_pages = view.catch_up(snapshot.view_read(), more)
        page = snapshot.page
        whole = replace(
            snapshot,
            # the latest page's earliest live deadline: when the leader wakes next
            page=page and replace(page, next_deadline_ms=view.next_deadline_ms),
            leases=view.leases(snapshot.now_ms),
            garbage=tuple(dict.fromkeys(garbage)),
            drop=tuple(dict.fromkeys(drop)),
        )
        return check_forged(self.keys, whole)

    def _read_page(self, cursor: int | str, sweep: str, sweep_count: int, expired: int) -> Snapshot:
        keys = self.keys
        with redis_errors("read the job's nodes"):
            reply = self._page(read_page_call(keys, cursor, sweep, sweep_count, expired))
        return parse_snapshot(keys, reply)

    def read_lease(self, name: str, snapshot: Snapshot, found: list[Garbage]) -> NodeLease | None:
        """One node's lease and report (a follower's SYNC reply holds none); garbage read in
        it is added to `found`."""
        if not name:
            return None
        pipe = self.client.pipeline(transaction=False)
        pipe.get(self.keys.node(name))
        pipe.pttl(self.keys.node(name))
        pipe.zscore(self.keys.leases, name)
        with redis_errors("read the master's lease"):
            raw, pttl, score = pipe.execute(raise_on_error=False)
        if any(isinstance(v, Exception) for v in (raw, pttl, score)) or score is None:
            return None  # a key of the wrong type is garbage the leader deals with
        entry = (name, repr(float(score)), raw or "", pttl)
        return read_lease(self.keys, snapshot.now_ms, entry, found)

    def members(self) -> tuple[str, ...]:
        """The record's members in group-rank order, read whole (a node that does not lead is
        handed its own place in them only, scripts.SYNC); () when there is no readable record."""
        raw = self._whole_record()
        if raw is None:
            return ()
        try:
            return JobRecord.from_json(raw).members
        except CorruptStateError:
            return ()

    def peer_reports(self, names: Sequence[str]) -> dict[str, NodeReport]:
        """The reports of the nodes named whose lease holds (one MGET): what a node reads of its
        peers to copy its checkpoints to them (job/checkpoints/replicaduties.py). Garbage is left
        out: a node whose report cannot be read counts as holding nothing."""
        if not names:
            return {}
        with redis_errors("read the peers' reports"):
            raws = self.client.mget([self.keys.node(name) for name in names])
        found = {}
        for name, raw in zip(names, raws, strict=True):
            if raw is None:
                continue
            try:
                report = NodeReport.from_json(raw)
            except CorruptStateError:
                continue
            if report.name == name:
                found[name] = report
        return found

    def hand_out(
        self, leader: str, shares: Mapping[str, str], drop: Sequence[str], reset: bool
    ) -> None:
        """The leader writes nodes their shares of the copies (coord/handouts.py)."""
        self._copies.write(leader, shares, drop, reset)

    def handout(self, name: str) -> Handout | None:
        """Node `name`'s share of the copies, as the leader wrote it (None: none)."""
        return self._copies.read(name)

    def put_speed(self, speed: NodeSpeed) -> None:
        """This node's pace over its last window (coord/speeds.py)."""
        self._speeds.put(speed)

    def speeds(self) -> dict[str, NodeSpeed]:
        return self._speeds.speeds()

    def slow_verdicts(self) -> dict[str, SlowVerdict]:
        return self._speeds.verdicts()

    def write_verdicts(
        self,
        leader: str,
        put: Sequence[SlowVerdict],
        gone: Sequence[str],
        drop_speeds: Sequence[str] = (),
    ) -> None:
        """The leader's slow verdicts, fenced by its lease (coord/speeds.py)."""
        self._speeds.write_verdicts(leader, put, gone, drop_speeds)

    def sync_many(self, reports: Sequence[NodeReport], held: str = "") -> None:
        """Heartbeats of many nodes in one pipeline (the fleet simulator, bench/fleet.py), each
        holding the record at revision `held` ("": none)."""
        pipe = self.client.pipeline(transaction=False)
        for report in reports:
            self._sync(self.sync_call(report, (), held or "-"), client=pipe)
        with redis_errors("heartbeats"):
            pipe.execute()

    def sync_call(
        self,
        report: NodeReport,
        events: Sequence[Event],
        held: str = "",
    ) -> Call:
        """This node's call of the SYNC script (scripts.py), named."""
        keys = self.keys
        if not held and self._held is not None and self._view.token is None:
            held = self._held.rev  # a follower (the leader reads the record every time)
        return Call(
            {
                "node": keys.node(report.name),
                "leases": keys.leases,
                "leader": keys.leader,
                "epoch": keys.leader_epoch,
                "job": keys.record,
                "events": keys.events,
                "commands": keys.commands,
                "cordons": keys.cordons,
                "changes": keys.changes,
                "change_seq": keys.change_seq,
                "digests": keys.digests,
                "ranks": keys.ranks,
            },
            {
                "name": report.name,
                "report": report.to_json(),
                "ttl": report.lease_ttl_ms,
                "events_maxlen": EVENTS_MAXLEN,
                "node_prefix": keys.node_prefix(),
                "digest": report.digest,
                "held_rev": held,
                "change_cursor": self._view.cursor,
                "sweep": self._view.sweep,
                "sweep_count": SWEEP,
                "page": PAGE,
            },
            [e.to_json() for e in events],
        )

    def snapshot(self) -> Snapshot:
        """A read-only snapshot (for status): the record and leader in one call, then every
        lease in pages (a ZSCAN: each lease as it was when its page was read)."""
        keys = self.keys
        with redis_errors("status"):
            reply = self._snapshot(
                Call(
                    {"leader": keys.leader, "job": keys.record}, {"node_prefix": keys.node_prefix()}
                )
            )
        header = parse_snapshot(keys, reply)
        garbage, drop = list(header.garbage), list(header.drop)

        def page(sweep: str) -> ViewRead[NodeReport]:
            read = self._read_page("+inf", sweep, PAGE, 0)
            garbage.extend(read.garbage)
            drop.extend(read.drop)
            return read.view_read()

        whole = replace(
            header,
            leases=sweep_all(page),
            garbage=tuple(dict.fromkeys(garbage)),
            drop=tuple(dict.fromkeys(drop)),
        )
        return check_forged(keys, whole)

    def commit(
        self, leader: str, rev: int, plan: RecordWrite, replacing_garbage: bool = False
    ) -> int:
        """Write the leader's plan, fenced by leader token and record revision.

        `replacing_garbage`: the record read at `rev` was unreadable, so whatever generation it
        claimed does not bind the new one. Garbage leases in `plan.drop` are removed if their
        score is still the one read.

        Raises:
            FencedError: another agent leads, the record moved, or a reaped node came back.
        """
        record = plan.record
        cursor = record.command_cursor if record else ""
        keys = self.keys
        with redis_errors("leader write"):
            if record is not None:
                self._ranks(leader, record)
            new_rev = self._commit(
                Call(
                    {
                        "leader": keys.leader,
                        "job": keys.record,
                        "leases": keys.leases,
                        "events": keys.events,
                        "changes": keys.changes,
                        "digests": keys.digests,
                        "wake": keys.wake,
                        "ranks": keys.ranks,
                    },
                    {
                        "leader_value": leader,
                        "rev": rev,
                        "record": record.to_json() if record else "",
                        "generation": record.generation if record else 0,
                        "cursor": cursor,
                        "events_maxlen": EVENTS_MAXLEN,
                        "node_prefix": self.keys.node_prefix(),
                        "replacing_garbage": "1" if replacing_garbage else "0",
                        "head": record.head_json() if record else "",
                        "members_digest": record.members_digest if record else "",
                        "reaped": len(plan.reap),
                    },
                    [
                        *plan.reap,
                        len(plan.drop),
                        *(part for pair in plan.drop for part in pair),
                        *(e.to_json() for e in plan.events),
                    ],
                )
            )
        self._view.forget([*plan.reap, *(name for name, _ in plan.drop)])
        return int(new_rev)

    def _ranks(self, leader: str, record: JobRecord) -> None:
        """Write the ranks of the record's members, in pages, unless they are written already
        (scripts.WRITE_RANKS; COMMIT then makes them the record's)."""
        digest = record.members_digest
        try:
            if self.client.hget(self.keys.ranks, ".members") == digest:
                return
        except redis.ResponseError:  # not a hash: garbage, which the first page replaces
            pass
        names = record.members
        for first in range(0, max(len(names), 1), RANKS_PAGE):
            page = names[first : first + RANKS_PAGE]
            self._write_ranks(
                Call(
                    {"leader": self.keys.leader, "ranks": self.keys.ranks},
                    {"leader_value": leader, "members_digest": digest, "first_rank": first},
                    page,
                )
            )

    def wake(self, why: str) -> None:
        """An entry on the job's wake stream (what followers' listeners wait on)."""
        with redis_errors("wake"):
            self.client.xadd(self.keys.wake, {"why": why}, maxlen=WAKE_MAXLEN, approximate=True)

    def leave(self, name: str, event: Event) -> None:
        keys = self.keys
        with redis_errors("leave"):
            self._leave(leave_call(keys, name, event))

    def depose(self, name: str, expected: str, ttl_ms: int, event: Event) -> bool:
        """Take the leader lease from `expected` (its value as read: "node token") for `name`,
        unless it moved meanwhile (scripts.DEPOSE); whether it was taken."""
        keys = self.keys
        call = Call(
            {"leader": keys.leader, "epoch": keys.leader_epoch, "events": keys.events},
            {
                "name": name,
                "expected": expected,
                "ttl": ttl_ms,
                "events_maxlen": EVENTS_MAXLEN,
                "event": event.to_json(),
            },
        )
        with redis_errors("take over the leader lease"):
            return bool(self._depose(call))

    def cordon(self, name: str, cordon: Cordon) -> None:
        """Keep `name` out of new generations (and, with drain, out of the running one)."""
        put_cordon(self.client, self.keys, name, cordon, "cordon")

    def uncordon(self, name: str, by: str) -> bool:
        """Lift `name`'s cordon; False if it had none."""
        return lift_cordon(self.client, self.keys, name, by, "uncordon")

    def cordons(self) -> dict[str, Cordon]:
        """Every readable cordon; garbage ones are logged and left out."""
        with redis_errors("read cordons"):
            raw: Any = self.client.hgetall(self.keys.cordons)
        found = {}
        for name, value in raw.items():
            try:
                found[str(name)] = Cordon.from_json(value)
            except CorruptStateError as exc:
                log.warning("ignoring cordon of %r: %s", name, exc)
        return found

    def send_command(self, command: Command) -> str:
        with redis_errors("send command"):
            entry_id = self.client.xadd(
                self.keys.commands,
                {"command": command.to_json()},
                maxlen=COMMANDS_MAXLEN,
                approximate=True,
            )
        return str(entry_id)

    def events(self, after: str = "-", count: int = 100) -> list[Event]:
        """Events after ID `after` (exclusive; "-" for the oldest kept), oldest first."""
        start = "-" if after == "-" else f"({after}"
        with redis_errors("read events"):
            entries: Any = self.client.xrange(self.keys.events, start, "+", count=count)
        return [_event(entry_id, fields) for entry_id, fields in entries]

    def events_tail(self, count: int) -> list[Event]:
        """The newest `count` events, oldest first."""
        with redis_errors("read events"):
            entries: Any = self.client.xrevrange(self.keys.events, "+", "-", count=count)
        return [_event(entry_id, fields) for entry_id, fields in reversed(entries)]

    @staticmethod
    def parse_event(entry_id: str, fields: dict[str, str]) -> Event:
        return _event(entry_id, fields)

    def last_event_id(self, stream: str | None = None) -> str:
        return streams.last_id(self.client, stream or self.keys.events)

    def wait_events(self, after: dict[str, str], block_ms: int) -> list[tuple[str, str, Any]]:
        """Block until an entry arrives on one of the streams in `after` (stream -> last ID)."""
        return streams.wait(self.client, after, block_ms)


def _event(entry_id: str, fields: dict[str, str]) -> Event:
    try:
        return Event.from_stream(entry_id, fields.get("event", ""))
    except CorruptStateError as exc:
        at_ms = int(entry_id.split("-")[0]) if entry_id.split("-")[0].isdigit() else None
        return Event("corrupt_event", message=str(exc), at_ms=at_ms, id=entry_id)
