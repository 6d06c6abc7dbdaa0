"""A pool read's reply, decoded (coord/pool.py's PoolStore.read): hashes as pairs and
decoded values, a page of leases with the reports they hold, and the jobs' statuses and the
nodes' reports decoded once while their text stays the same. What nodeagent did not write is
said in `garbage`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nodeagent.coord.view import Lease
from nodeagent.errors import CorruptStateError
from nodeagent.model.decode import NAME_RE
from nodeagent.model.pool import PoolJob, PoolNode
from nodeagent.model.queues import QueueView

MAX_REPORTS = 50_000


JOBS_REREAD_MS = 10_000  # how often a pool leader reads every job (server time)


@dataclass(frozen=True)
class HeldJobs:
    """The jobs' statuses as one pool leader (its lease value) last read them. Between its
    rounds it reads only the jobs changed since its last read (the job changes set, which every
    script that writes or deletes a status or a spec notes: fragments.NOTE_JOB), and all of
    them every JOBS_REREAD_MS and on a new term: what was written by hand is seen then. At
    10,000 pending jobs reading and matching them all took a fifth of a round."""

    leader: str
    read_ms: int  # the server time of the read (a change at that ms or later is read next)
    full_ms: int  # the server time of its last read of every job
    statuses: Mapping[str, PoolJob]
    bad: Mapping[str, str]  # job -> why its status is not one nodeagent writes

    def since(self, leader: str | None) -> int | None:
        """Read the jobs changed since this time (None: read them all)."""
        if leader != self.leader or self.read_ms - self.full_ms >= JOBS_REREAD_MS:
            return None
        return self.read_ms


class StatusMemo:
    """The jobs' statuses, each decoded once while its text stays the same: a pool leader
    reading 10,000 pending jobs a round decodes only those that moved."""

    def __init__(self) -> None:
        self._by_text: dict[str, PoolJob] = {}

    def decode(self, flat: Sequence[Any]) -> tuple[dict[str, PoolJob], dict[str, str]]:
        """Every job's status from a whole read, and why each unreadable one is."""
        kept: dict[str, PoolJob] = {}
        found: dict[str, PoolJob] = {}
        bad: dict[str, str] = {}
        for name, raw in pairs(flat):
            status = self._one(name, raw, bad)
            if status is not None:
                kept[raw] = found[name] = status
        self._by_text = kept
        return found, bad

    def changed(
        self, held: HeldJobs, flat: Sequence[Any]
    ) -> tuple[dict[str, PoolJob], dict[str, str], frozenset[str]]:
        """`held`'s statuses with the changed jobs' (`flat`: job, status or None when deleted)
        read over them, why each unreadable one is, and the jobs changed. A job keeps its place
        in the order (as a hash's field does when it is written again)."""
        found, bad = dict(held.statuses), dict(held.bad)
        names = []
        for i in range(0, len(flat) - 1, 2):
            name, raw = str(flat[i]), flat[i + 1]
            names.append(name)
            bad.pop(name, None)
            status = self._one(name, str(raw), bad) if raw is not None else None
            if status is None:
                found.pop(name, None)
            else:
                self._by_text[str(raw)] = found[name] = status
        return found, bad, frozenset(names)

    def _one(self, name: str, raw: str, bad: dict[str, str]) -> PoolJob | None:
        status = self._by_text.get(raw)
        if status is None:
            try:
                status = PoolJob.from_json(raw)
            except CorruptStateError as exc:
                bad[name] = f"pool job {name[:64]!r}: {exc}"
        return status


class ReportMemo:
    """The nodes' reports, each decoded once while its text stays the same: a listing of
    1,000 nodes decoded them all at every read (35 of its 43 ms here), though a report changes
    only when its node's state does. Bounded (past MAX_REPORTS it starts over). Shared by the
    threads of a reader: a race loses an entry, never a report (a PoolNode is frozen)."""

    def __init__(self) -> None:
        self._by_text: dict[str, PoolNode] = {}

    def decode(self, raw: str) -> PoolNode:
        """Raises: CorruptStateError, as PoolNode.from_json."""
        report = self._by_text.get(raw)
        if report is None:
            report = PoolNode.from_json(raw)
            if len(self._by_text) >= MAX_REPORTS:
                self._by_text = {}
            self._by_text[raw] = report
        return report


def pairs(flat: Sequence[Any]) -> list[tuple[str, str]]:
    return [(str(flat[i]), str(flat[i + 1])) for i in range(0, len(flat) - 1, 2)]


def decoded(flat: Sequence[Any], decode: Any, what: str, garbage: list[str]) -> dict[str, Any]:
    found = {}
    for name, raw in pairs(flat):
        try:
            found[name] = decode(raw)
        except CorruptStateError as exc:
            garbage.append(f"{what} {name[:64]!r}: {exc}")
    return found


def leases(
    now: int,
    flat: Sequence[Any],
    reports: Sequence[Any],
    garbage: list[str],
    decode: Callable[[str], PoolNode] = PoolNode.from_json,
) -> tuple[tuple[Lease[PoolNode], ...], tuple[str, ...]]:
    """The leases of a READ_PAGE reply (an entry with no deadline: its node holds none);
    `decode` reads a report (ReportMemo's: once while its text is the same)."""
    leases: list[Lease[PoolNode]] = []
    gone: list[str] = []
    for i, raw in enumerate(reports):
        name, score = str(flat[2 * i]), flat[2 * i + 1]
        if score is None:
            gone.append(name)
            continue
        until = deadline(name, str(score), garbage)
        if until is None:
            continue
        if not NAME_RE.match(name):
            garbage.append(f"pool lease {name[:64]!r}: not a node name")
            continue
        report = None
        if until > now and raw:
            try:
                report = decode(raw)
            except CorruptStateError as exc:
                garbage.append(f"pool node {name!r}: {exc}")
            else:
                if report.name != name:
                    garbage.append(f"pool node {name!r}: its report names {report.name!r}")
                    report = None
        leases.append(Lease(name, until, report))
    return tuple(leases), tuple(gone)


def deadline(name: str, score: str, garbage: list[str]) -> int | None:
    try:
        return int(float(score))
    except (ValueError, OverflowError):
        garbage.append(f"pool lease {name[:64]!r}: deadline {score[:32]!r} is not a number")
        return None


def queue_of(name: str, raw: Any) -> QueueView | None:
    """Queue `name` from its field in the queues hash (None: not made, or unreadable)."""
    try:
        found = QueueView.from_json(raw) if raw is not None else None
    except CorruptStateError:
        return None
    return found if found is not None and found.name == name else None


def status_of(raw: Any) -> PoolJob | None:
    """A stored status, None when there is none or it does not decode."""
    try:
        return PoolJob.from_json(raw) if raw else None
    except CorruptStateError:
        return None
