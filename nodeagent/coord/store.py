"""JobStore: the job's state in Redis, read and written through the scripts in scripts.py.

Turns Redis replies into model objects and Redis failures into CoordinationError / FencedError.
Values that are not what nodeagent writes are reported (never trusted): a corrupt job record is
returned as `record=None` with `record_error` set, so the leader rewrites it from what the nodes
remember; a corrupt node report makes that node count as absent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import redis

from nodeagent.coord import scripts
from nodeagent.coord.keys import COMMANDS_MAXLEN, EVENTS_MAXLEN, JobKeys
from nodeagent.errors import CoordinationError, CorruptStateError, FencedError
from nodeagent.leader import ClusterView, Plan
from nodeagent.model import Command, Cordon, Event, JobRecord, NodeReport

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class NodeLease:
    name: str
    deadline_ms: int
    report: NodeReport | None  # None: missing or unreadable


@dataclass(frozen=True)
class Snapshot:
    """What Redis holds about a job at server time `now_ms`."""

    now_ms: int
    leader: str | None
    rev: int
    record: JobRecord | None
    record_error: str | None = None
    cordon: Cordon | None = None  # the syncing node's own cordon
    leader_deadline_ms: int | None = None  # when the leader lease lapses unless renewed
    leases: tuple[NodeLease, ...] = ()
    commands: tuple[Command, ...] = ()
    command_cursor: str | None = None  # last command entry read, valid or not
    errors: tuple[str, ...] = field(default=())

    @property
    def leader_name(self) -> str | None:
        return self.leader.split(" ", 1)[0] if self.leader else None

    def cluster_view(self) -> ClusterView:
        live = {
            lease.name: lease.report
            for lease in self.leases
            if lease.report is not None and lease.deadline_ms > self.now_ms
        }
        expired = tuple(lease.name for lease in self.leases if lease.deadline_ms <= self.now_ms)
        return ClusterView(
            now_ms=self.now_ms,
            record=self.record,
            nodes=live,
            expired=expired,
            commands=self.commands,
            command_cursor=self.command_cursor,
        )


@contextmanager
def _redis_errors(what: str) -> Iterator[None]:
    try:
        yield
    except redis.ResponseError as exc:
        if str(exc).startswith("FENCED"):
            raise FencedError(f"{what}: {exc}") from exc
        raise CoordinationError(f"{what}: Redis answered {exc}") from exc
    except redis.RedisError as exc:
        raise CoordinationError(f"{what}: {type(exc).__name__}: {exc}") from exc


class JobStore:
    """One job's keys in one Redis, for one agent or one nodeagentctl."""

    def __init__(self, client: redis.Redis, keys: JobKeys) -> None:
        self.client = client
        self.keys = keys
        self._sync = client.register_script(scripts.SYNC)
        self._snapshot = client.register_script(scripts.SNAPSHOT)
        self._commit = client.register_script(scripts.COMMIT)
        self._leave = client.register_script(scripts.LEAVE)

    def sync(self, report: NodeReport, events: Sequence[Event] = ()) -> Snapshot:
        """Heartbeat: renew the lease, take or keep the leader lease, append events, read.

        The leader gets the whole cluster (leases, reports, new commands); others the record.
        """
        keys, args = self._sync_call(report, events)
        with _redis_errors("heartbeat"):
            reply = self._sync(keys=keys, args=args)
        return _parse_snapshot(reply)

    def sync_many(self, reports: Sequence[NodeReport]) -> None:
        """Heartbeats of many nodes in one pipeline (the fleet simulator, bench/fleet.py)."""
        pipe = self.client.pipeline(transaction=False)
        for report in reports:
            keys, args = self._sync_call(report, ())
            self._sync(keys=keys, args=args, client=pipe)
        with _redis_errors("heartbeats"):
            pipe.execute()

    def _sync_call(
        self, report: NodeReport, events: Sequence[Event]
    ) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV of the SYNC script (see its header in scripts.py)."""
        keys = self.keys
        return (
            [
                keys.node(report.name),
                keys.leases,
                keys.leader,
                keys.leader_epoch,
                keys.record,
                keys.events,
                keys.commands,
                keys.cordons,
            ],
            [
                report.name,
                report.to_json(),
                report.lease_ttl_ms,
                EVENTS_MAXLEN,
                keys.node_prefix(),
                *(e.to_json() for e in events),
            ],
        )

    def snapshot(self) -> Snapshot:
        """A read-only, consistent snapshot (for status)."""
        keys = self.keys
        with _redis_errors("status"):
            reply = self._snapshot(
                keys=[keys.leases, keys.leases, keys.leader, keys.record],
                args=["", "", "", "", keys.node_prefix()],
            )
        return _parse_snapshot(reply)

    def commit(self, leader: str, rev: int, plan: Plan) -> int:
        """Write the leader's plan, fenced by leader token and record revision.

        Raises:
            FencedError: another agent leads, the record moved, or a reaped node came back.
        """
        record = plan.record
        cursor = record.command_cursor if record else ""
        with _redis_errors("leader write"):
            new_rev = self._commit(
                keys=[self.keys.leader, self.keys.record, self.keys.leases, self.keys.events],
                args=[
                    leader,
                    rev,
                    record.to_json() if record else "",
                    record.generation if record else 0,
                    cursor,
                    EVENTS_MAXLEN,
                    self.keys.node_prefix(),
                    len(plan.reap),
                    *plan.reap,
                    *(e.to_json() for e in plan.events),
                ],
            )
        return int(new_rev)

    def leave(self, name: str, event: Event) -> None:
        keys = self.keys
        with _redis_errors("leave"):
            self._leave(
                keys=[keys.node(name), keys.leases, keys.leader, keys.events],
                args=[name, EVENTS_MAXLEN, event.to_json()],
            )

    def cordon(self, name: str, cordon: Cordon) -> None:
        """Keep `name` out of new generations (and, with drain, out of the running one)."""
        verb = "drained" if cordon.drain else "cordoned"
        event = Event(
            f"node_{verb}",
            node=name,
            message=f"{cordon.reason} (by {cordon.by})",
            data={"by": cordon.by, "drain": cordon.drain},
        )
        with _redis_errors("cordon"):
            pipe = self.client.pipeline(transaction=True)
            pipe.hset(self.keys.cordons, name, cordon.to_json())
            pipe.xadd(
                self.keys.events, {"event": event.to_json()}, maxlen=EVENTS_MAXLEN, approximate=True
            )
            pipe.execute()

    def uncordon(self, name: str, by: str) -> bool:
        """Lift `name`'s cordon; False if it had none."""
        event = Event("node_uncordoned", node=name, message=f"by {by}", data={"by": by})
        with _redis_errors("uncordon"):
            pipe = self.client.pipeline(transaction=True)
            pipe.hdel(self.keys.cordons, name)
            pipe.xadd(
                self.keys.events, {"event": event.to_json()}, maxlen=EVENTS_MAXLEN, approximate=True
            )
            removed, _ = pipe.execute()
        return bool(removed)

    def cordons(self) -> dict[str, Cordon]:
        with _redis_errors("read cordons"):
            raw: Any = self.client.hgetall(self.keys.cordons)
        found = {}
        for name, value in raw.items():
            try:
                found[str(name)] = Cordon.from_json(value)
            except CorruptStateError as exc:
                log.warning("ignoring cordon of %s: %s", name, exc)
        return found

    def send_command(self, command: Command) -> str:
        with _redis_errors("send command"):
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
        with _redis_errors("read events"):
            entries: Any = self.client.xrange(self.keys.events, start, "+", count=count)
        return [_event(entry_id, fields) for entry_id, fields in entries]

    def events_tail(self, count: int) -> list[Event]:
        """The newest `count` events, oldest first."""
        with _redis_errors("read events"):
            entries: Any = self.client.xrevrange(self.keys.events, "+", "-", count=count)
        return [_event(entry_id, fields) for entry_id, fields in reversed(entries)]

    @staticmethod
    def parse_event(entry_id: str, fields: dict[str, str]) -> Event:
        return _event(entry_id, fields)

    def last_event_id(self, stream: str | None = None) -> str:
        with _redis_errors("read events"):
            last: Any = self.client.xrevrange(stream or self.keys.events, "+", "-", count=1)
        return str(last[0][0]) if last else "0-0"

    def wait_events(self, after: dict[str, str], block_ms: int) -> list[tuple[str, str, Any]]:
        """Block until an entry arrives on one of the streams in `after` (stream -> last ID)."""
        with _redis_errors("wait for events"):
            reply: Any = self.client.xread(after, block=block_ms)  # type: ignore[arg-type]
        return [
            (stream, entry_id, fields) for stream, entries in reply for entry_id, fields in entries
        ]


def _event(entry_id: str, fields: dict[str, str]) -> Event:
    try:
        return Event.from_stream(entry_id, fields.get("event", ""))
    except CorruptStateError as exc:
        return Event(
            "corrupt_event", message=str(exc), at_ms=int(entry_id.split("-")[0]), id=entry_id
        )


def _parse(parse: Callable[[str], T], raw: str, errors: list[str]) -> T | None:
    try:
        return parse(raw)
    except CorruptStateError as exc:
        errors.append(str(exc))
        return None


def _parse_snapshot(reply: Sequence[Any]) -> Snapshot:
    now_ms, leader, rev, raw_record = (int(reply[0]), reply[1] or None, int(reply[2]), reply[3])
    errors: list[str] = []
    record = _parse(JobRecord.from_json, raw_record, errors) if raw_record else None
    record_error = errors[0] if errors else None
    cordon = _parse(Cordon.from_json, reply[4], errors) if len(reply) > 4 and reply[4] else None
    leases: list[NodeLease] = []
    commands: list[Command] = []
    leader_deadline = int(reply[5]) if len(reply) > 5 and reply[5] else None
    if len(reply) > 6:
        flat, reports = reply[6], reply[7]
        for i, raw in enumerate(reports):
            report = _parse(NodeReport.from_json, raw, errors) if raw else None
            leases.append(NodeLease(str(flat[2 * i]), int(float(flat[2 * i + 1])), report))
    cursor = None
    for entry_id, fields in reply[8] if len(reply) > 8 else ():
        cursor = str(entry_id)
        pairs = dict(zip(fields[::2], fields[1::2], strict=False))
        try:
            commands.append(Command.from_stream(cursor, pairs.get("command", "")))
        except CorruptStateError as exc:
            errors.append(f"skipped: {exc}")
    return Snapshot(
        now_ms=now_ms,
        leader=leader,
        rev=rev,
        record=record,
        record_error=record_error,
        cordon=cordon,
        leader_deadline_ms=leader_deadline,
        leases=tuple(leases),
        commands=tuple(commands),
        command_cursor=cursor,
        errors=tuple(errors),
    )
