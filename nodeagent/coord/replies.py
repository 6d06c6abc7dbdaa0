"""The replies of the SYNC and SNAPSHOT scripts, decoded into a Snapshot. Pure; never raises.

Every value is checked (nodeagent.model.decode): what is not what nodeagent writes becomes a Garbage
item and is left out. A garbage lease (a deadline that is not a finite integer, or beyond its
node key's TTL, or a member that is not a node name) is also listed in `drop`, so the leader
removes it; the one-shot phantom (a lease and a report written by hand, with no TTL or with a
deadline far ahead) is garbage by these rules.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from nodeagent.coord.keys import JobKeys
from nodeagent.coord.view import Lease, ViewPage, ViewRead, as_text, parse_page
from nodeagent.errors import CorruptStateError
from nodeagent.model.decode import MAX_INT, NAME_RE, parse_uint
from nodeagent.model.garbage import KINDS, Garbage
from nodeagent.model.job import ClusterView, Command, Cordon, JobRecord, NodeReport
from nodeagent.state import JobState, NodeState

T = TypeVar("T")
# A lease deadline and its node key's expiry are set in one script with one TTL; they may differ
# by the script's run time. Anything later than this past the key's expiry is garbage.
LEASE_SLACK_MS = 1000


NodeLease = Lease[NodeReport]


@dataclass(frozen=True)
class HeldRecord:
    """The record a node decoded at a revision, so SYNC need not send it again (it replies 1)."""

    rev: str  # as read
    record: JobRecord | None
    error: str | None
    garbage: tuple[Garbage, ...]
    head: bool = False  # read as its head and this node's rank (JobRecord.from_head)


@dataclass(frozen=True)
class Snapshot:
    """What Redis holds about a job at server time `now_ms`.

    `stored_record` is the job record as decoded (what the leader plans from); `record` is the one
    this node may act on: the same, unless it is RUNNING and its master could not be verified
    (job/verify.py, applied by JobStore.sync), in which case it reads RESTARTING until it can.
    """

    now_ms: int
    leader: str | None
    rev: int
    record: JobRecord | None
    record_error: str | None = None  # the stored record is garbage: the leader rewrites it
    cordon: Cordon | None = None  # the syncing node's own cordon
    leader_deadline_ms: int | None = None  # when the leader lease lapses unless renewed
    leases: tuple[NodeLease, ...] = ()
    commands: tuple[Command, ...] = ()
    command_cursor: str | None = None  # last command entry read, valid or not
    garbage: tuple[Garbage, ...] = ()
    drop: tuple[tuple[str, str], ...] = ()  # garbage leases: (member, score as read)
    stored_record: JobRecord | None = None
    gone: tuple[str, ...] = ()  # read: they hold no lease (a leader's page)
    page: ViewPage | None = None  # a leader's read: what else it says
    held: HeldRecord | None = None  # the record as this reply gave it
    # (a leader's read) why what the other nodes read of the record (its head and their ranks)
    # is not the record's: the leader writes it again
    stale_head: str | None = None

    @property
    def leader_name(self) -> str | None:
        return self.leader.split(" ", 1)[0] if self.leader else None

    @property
    def errors(self) -> tuple[str, ...]:
        return tuple(g.describe() for g in self.garbage)

    def view_read(self) -> ViewRead[NodeReport]:
        return ViewRead(self.leader, self.leases, self.gone, self.drop, self.page)

    def lease(self, name: str) -> NodeLease | None:
        return next((lease for lease in self.leases if lease.name == name), None)

    def cluster_view(self) -> ClusterView:
        live = {
            lease.name: lease.report
            for lease in self.leases
            if lease.report is not None and lease.deadline_ms > self.now_ms
        }
        now = self.now_ms
        lapsed = {n.name: n.deadline_ms for n in self.leases if n.deadline_ms <= now}
        return ClusterView(
            now_ms=self.now_ms,
            record=self.stored_record,
            nodes=live,
            expired=tuple(lapsed),
            expired_ms=lapsed,
            commands=self.commands,
            command_cursor=self.command_cursor,
            drop=self.drop,
        )


def master_problem(record: JobRecord, lease: NodeLease | None, now_ms: int) -> tuple[str, bool]:
    """Why a RUNNING record's MASTER_ADDR cannot be trusted ("" if it can), and whether the
    record contradicts what its rank-0 member published (it is forged, not merely stale).

    MASTER_ADDR must be the published address of the rank-0 member, a node that holds a live
    lease, reported itself and acknowledged this generation (when it did, its address and the
    port it offered are the ones the leader wrote).
    """
    if not record.members:
        return "it has no members", True
    master = record.members[0]
    if lease is None or lease.deadline_ms <= now_ms:
        return f"its rank-0 member {master} holds no live lease", False
    report = lease.report
    if report is None:
        return f"its rank-0 member {master} has no readable report", False
    if report.acked_generation != record.generation:
        # A leader writes RUNNING g only once every live member acknowledged g, and a member
        # only ever acknowledges the record's generation: unless it just restarted (JOINING),
        # the record is not one a leader wrote.
        forged = report.state is not NodeState.JOINING
        return f"its rank-0 member {master} has not acknowledged it", forged
    published = (report.address, report.free_port)
    if published != (record.master_addr, record.master_port):
        return (
            f"its master {record.master_addr}:{record.master_port} is not what {master} "
            f"published ({report.address}:{report.free_port})",
            True,
        )
    return "", False


def _sample(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _decode(
    parse: Callable[[str], T], raw: Any, garbage: list[Garbage], kind: str, key: str, action: str
) -> T | None:
    try:
        return parse(raw)
    except CorruptStateError as exc:
        garbage.append(Garbage(kind, key, str(exc), action))
        return None


def read_lease(
    keys: JobKeys, now_ms: int, entry: tuple[Any, Any, Any, Any], garbage: list[Garbage]
) -> NodeLease | None:
    """One lease: (member, score, report, node key PTTL). None when the lease is garbage."""
    raw_name, raw_score, raw_report, pttl = entry
    name, score = as_text(raw_name), as_text(raw_score)
    problem = ""
    try:
        deadline = float(score)
    except ValueError:
        deadline = math.nan
    if not NAME_RE.match(name):
        problem = f"member {_sample(name)} is not a node name"
    elif not (math.isfinite(deadline) and deadline.is_integer() and 0 <= deadline <= MAX_INT):
        problem = f"member {name} has deadline {score}, not a time in ms"
    elif deadline > now_ms and int(pttl) < 0:
        problem = f"member {name} has a live deadline but " + (
            "its node key has no TTL" if int(pttl) == -1 else "no node key"
        )
    elif deadline > now_ms + int(pttl) + LEASE_SLACK_MS:
        problem = f"member {name} has a deadline beyond its node key's TTL"
    if problem:
        garbage.append(Garbage("leases", keys.leases, problem, "removed"))
        return None
    report = None
    if raw_report:
        key = keys.node(name)
        report = _decode(NodeReport.from_json, raw_report, garbage, "node", key, "ignored")
        if report is not None and report.name != name:
            garbage.append(Garbage("node", key, f"report names {report.name}", "ignored"))
            report = None
    return NodeLease(name, int(deadline), report)


def _leases(
    keys: JobKeys, now_ms: int, reply: Sequence[Any], garbage: list[Garbage]
) -> tuple[tuple[NodeLease, ...], tuple[tuple[str, str], ...], tuple[str, ...]]:
    """The leases read (an entry with no deadline: its node holds none, it is gone)."""
    if len(reply) < 10:
        return (), (), ()
    flat, reports, ttls = reply[7], reply[8], reply[9]
    leases, drop, gone = [], [], []
    for i, raw_report in enumerate(reports):
        if flat[2 * i + 1] is None:
            gone.append(as_text(flat[2 * i]))
            continue
        entry = (flat[2 * i], flat[2 * i + 1], raw_report, ttls[i])
        lease = read_lease(keys, now_ms, entry, garbage)
        if lease is None:
            drop.append((as_text(entry[0]), as_text(entry[1])))
        else:
            leases.append(lease)
    return tuple(leases), tuple(drop), tuple(gone)


def _page(
    keys: JobKeys, now_ms: int, reply: Sequence[Any], garbage: list[Garbage], drop: list[Any]
) -> ViewPage | None:
    def check(name: str, score: str) -> int | None:
        lease = read_lease(keys, now_ms, (name, score, "", 0), garbage)
        if lease is None:
            drop.append((name, score))
        return lease.deadline_ms if lease else None

    return parse_page(reply, check)


def _commands(
    keys: JobKeys, reply: Sequence[Any], garbage: list[Garbage]
) -> tuple[tuple[Command, ...], str | None]:
    """The new commands; the cursor moves past every entry read, valid or not."""
    commands: list[Command] = []
    cursor = None
    for entry_id, fields in reply[10] if len(reply) > 10 else ():
        cursor = as_text(entry_id)
        pairs = dict(zip(fields[::2], fields[1::2], strict=False))
        raw = pairs.get("command", "")

        def parse(raw: str, entry: str = cursor) -> Command:
            return Command.from_stream(entry, raw)

        command = _decode(parse, raw, garbage, "commands", keys.commands, "skipped")
        if command is not None:
            commands.append(command)
    return tuple(commands), cursor


def _notes(reply: Sequence[Any]) -> list[Garbage]:
    """What the script noted: "kind<TAB>key<TAB>problem<TAB>action" each."""
    found = []
    for raw in reply[6] if len(reply) > 6 and reply[6] else ():
        parts = as_text(raw).split("\t")
        if len(parts) == 4:
            kind = parts[0] if parts[0] in KINDS else "job"
            found.append(Garbage(kind, parts[1], parts[2], parts[3]))
    return found


def parse_snapshot(
    keys: JobKeys, reply: Sequence[Any], held: HeldRecord | None = None, me: str = ""
) -> Snapshot:
    """A Snapshot of a SYNC, SNAPSHOT or READ_PAGE reply (layouts in scripts.py), read by node
    `me`. A record sent as 1 is the one `held` (this node has it at that revision)."""
    garbage = _notes(reply)
    now_ms = int(reply[0])
    rev = parse_uint(reply[2])
    if rev is None:
        garbage.append(Garbage("job", keys.record, f"field rev {_sample(reply[2])} is not a count"))
    if reply[3] == 1 and held is not None and held.rev == as_text(reply[2]):
        garbage += held.garbage
    else:
        held = _held(keys, as_text(reply[2]), reply[3], me)
        garbage += held.garbage
    record, record_error = held.record, held.error
    cordon = None
    if reply[4]:
        cordon = _decode(Cordon.from_json, reply[4], garbage, "cordons", keys.cordons, "ignored")
    leases, drop, gone = _leases(keys, now_ms, reply, garbage)
    more_drop: list[tuple[str, str]] = []
    page = _page(keys, now_ms, reply, garbage, more_drop)
    commands, cursor = _commands(keys, reply, garbage)
    stale_head = _stale_head(keys, record, reply, garbage)
    snapshot = Snapshot(
        now_ms=now_ms,
        leader=as_text(reply[1]) if reply[1] else None,
        rev=rev or 0,
        record=record,
        record_error=record_error,
        cordon=cordon,
        leader_deadline_ms=int(reply[5]) if reply[5] else None,
        leases=leases,
        commands=commands,
        command_cursor=cursor,
        garbage=tuple(garbage),
        drop=(*drop, *more_drop),
        stored_record=record,
        gone=gone,
        page=page,
        held=held,
        stale_head=stale_head,
    )
    return check_forged(keys, snapshot) if len(reply) > 7 else snapshot


def _stale_head(
    keys: JobKeys, record: JobRecord | None, reply: Sequence[Any], garbage: list[Garbage]
) -> str | None:
    """Why the head, members digest or ranks hash a leader's SYNC read are not its record's
    (None: they are, or this is no such read). Missing ones are written again quietly (the
    record was written by an older nodeagent, or they were deleted); wrong ones are garbage."""
    if record is None or len(reply) <= 17:
        return None
    head, members, ranks = (as_text(v) if v else None for v in (*reply[17], None, None, None)[:3])
    want = record.members_digest
    found = [
        ("field head", keys.record, head, record.head_json()),
        ("field members", keys.record, members, want),
        ("the ranks hash's field .members", keys.ranks, ranks, want),
    ]
    for what, key, value, expected in found:
        if value is None:
            return f"{what} is missing"
        if value != expected:
            problem = f"{what} is not the record's: {_sample(value)}"
            garbage.append(Garbage("job", key, problem, "written again at a new revision"))
            return problem
    return None


def _held(keys: JobKeys, rev: str, raw: Any, me: str) -> HeldRecord:
    if not raw or raw == 1:  # none (or 1 with nothing held: read as none until the next write)
        return HeldRecord(rev, None, None, ())
    errors: list[Garbage] = []
    if isinstance(raw, list):  # the head and this node's rank (scripts.SYNC)
        head, raw_rank = raw[0], raw[1] if len(raw) > 1 else None
        rank = parse_uint(raw_rank) if raw_rank is not None else None

        def parse(raw: str) -> JobRecord:
            if raw_rank is not None and rank is None:
                raise CorruptStateError(f"rank {_sample(raw_rank)} of {me} is not a count")
            return JobRecord.from_head(raw, me, rank)

        action = f"{me} reads the whole record"
        record = _decode(parse, head, errors, "job", keys.record, action)
        return HeldRecord(rev, record, errors[0].problem if errors else None, (*errors,), True)
    action = "the leader rewrites it"
    record = _decode(JobRecord.from_json, raw, errors, "job", keys.record, action)
    return HeldRecord(rev, record, errors[0].problem if errors else None, tuple(errors))


def check_forged(keys: JobKeys, snapshot: Snapshot) -> Snapshot:
    """With every lease at hand (the leader, status): a RUNNING record that contradicts what its
    rank-0 member published is forged: planned from as if it were unreadable."""
    record = snapshot.stored_record
    if record is None or record.state is not JobState.RUNNING:
        return snapshot
    master = record.members[0] if record.members else ""
    problem, forged = master_problem(record, snapshot.lease(master), snapshot.now_ms)
    if not forged:
        return snapshot
    item = Garbage("job", keys.record, f"record: {problem}", "the leader rewrites it")
    return replace(
        snapshot,
        record=None,
        stored_record=None,
        record_error=item.problem,
        garbage=(*snapshot.garbage, item),
    )
