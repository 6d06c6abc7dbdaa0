"""A pool read's reply, decoded (coord/pool.py's PoolStore.read): hashes as pairs and
decoded values, a page of leases with the reports they hold, and the jobs' statuses and the
nodes' reports decoded once while their text stays the same. What nodeagent did not write is
said in `garbage`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from nodeagent.coord.view import Lease
from nodeagent.errors import CorruptStateError
from nodeagent.model.decode import NAME_RE
from nodeagent.model.pool import PoolJob, PoolNode
from nodeagent.model.queues import QueueView

MAX_REPORTS = 50_000


class StatusMemo:
    """The jobs' statuses, each decoded once while its text stays the same: a pool leader
    reading 10,000 pending jobs a round decodes only those that moved."""

    def __init__(self) -> None:
        self._by_text: dict[str, PoolJob] = {}

    def decode(self, flat: Sequence[Any], garbage: list[str]) -> dict[str, PoolJob]:
        kept, found = {}, {}
        for name, raw in pairs(flat):
            status = self._by_text.get(raw)
            if status is None:
                try:
                    status = PoolJob.from_json(raw)
                except CorruptStateError as exc:
                    garbage.append(f"pool job {name[:64]!r}: {exc}")
                    continue
            kept[raw] = found[name] = status
        self._by_text = kept
        return found


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
