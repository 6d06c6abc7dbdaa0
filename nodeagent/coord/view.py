"""The leader's kept view of a job's leases: read once, then only what changed. Pure.

A leader used to read every node's report at every heartbeat: one Lua call that grew with the
fleet (226 ms at 10,000 nodes, during which Redis serves no one else). Now each heartbeat reads
a page (fragments.READ_VIEW): the nodes whose report changed since the leader's cursor, a slice
of a slow sweep over every lease, and the expired leases, which stay exact (the sorted set by
deadline). This view folds the pages into what the leader plans from.

What it knows of a lease it did not read this round: the deadline it read then, which has only
grown since, and, since the lease is not among the expired, one no earlier than the earliest
live deadline. So `leases()` gives each a lower bound of its deadline that is later than now:
the one it read while that is ahead, else the earliest live deadline; exact for the leases read
this round and for every expired one.

The view starts over (everything read again, in pages) when the leader's token changes (a new
term: the change set may have moved while another node led) and when the change counter is
below the cursor. A change set lost and rebuilt restarts its counter from the server time, above
the cursor, so the leader reads each node as it marks itself again and keeps the others.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from nodeagent.model.decode import MAX_INT, parse_uint

R = TypeVar("R")
log = logging.getLogger(__name__)

PAGE = 500  # nodes read per call: about a millisecond of Redis time
SWEEP = 50  # leases swept per heartbeat: each one read again every M / SWEEP heartbeats
MAX_PAGES = 1000  # calls of one read: a leader plans from what it has read after that many


@dataclass(frozen=True)
class Lease(Generic[R]):
    """A node's lease as a leader read it: its deadline (server ms) and its report (a job's
    NodeReport, a pool's PoolNode; None when missing or unreadable)."""

    name: str
    deadline_ms: int
    report: R | None


@dataclass(frozen=True)
class ViewPage:
    """What a leader's read (fragments.READ_VIEW) says beyond the leases it read."""

    seq: int  # the change counter now
    reached: int  # the last change number read (the cursor to read from next)
    more: bool  # a page was full: read on before planning
    expired: tuple[tuple[str, int], ...]  # leases past their deadline: (name, exact deadline)
    next_deadline_ms: int | None  # the earliest live lease deadline
    sweep: str  # the ZSCAN cursor of the sweep ("0": a pass ended)


@dataclass(frozen=True)
class ViewRead(Generic[R]):
    """One page as read: the leases read (valid ones), those that hold none (gone), garbage
    leases to drop (member, score as read), and the rest of the page."""

    leader: str | None
    leases: tuple[Lease[R], ...]
    gone: tuple[str, ...] = ()
    drop: tuple[tuple[str, str], ...] = ()
    page: ViewPage | None = None


class LeaderView(Generic[R]):
    def __init__(self) -> None:
        self.token: str | None = None
        self.cursor = 0
        self.sweep = "0"
        self._leases: dict[str, Lease[R]] = {}
        self._fresh: dict[str, Lease[R]] = {}  # read this round, and every expired lease
        self._next_deadline: int | None = None

    def start(self, snapshot: ViewRead[R]) -> bool:
        """A new round from the leader's heartbeat. False when the view started over: what it
        read from the old cursor is kept, but everything must be read again from 0."""
        page = snapshot.page
        self._fresh = {}
        fresh_term = snapshot.leader != self.token
        if fresh_term or (page is not None and page.seq < self.cursor):
            self.token, self.cursor, self.sweep = snapshot.leader, 0, "0"
            self._leases = {}
            self.add(snapshot, keep_cursor=False)
            return False
        self.add(snapshot)
        return True

    def add(self, snapshot: ViewRead[R], keep_cursor: bool = True) -> None:
        """Fold in one page (of SYNC or READ_PAGE)."""
        page = snapshot.page
        for name in snapshot.gone:
            self._leases.pop(name, None)
            self._fresh.pop(name, None)
        self.forget(name for name, _ in snapshot.drop)
        for lease in snapshot.leases:
            self._leases[lease.name] = self._fresh[lease.name] = lease
        if page is None:
            return
        for name, deadline in page.expired:
            known = self._leases.get(name)
            kept = Lease(name, deadline, known.report if known else None)
            self._leases[name] = self._fresh[name] = kept
        self._next_deadline = page.next_deadline_ms
        if keep_cursor:
            self.cursor = max(self.cursor, page.reached)
            if page.sweep:
                self.sweep = page.sweep

    def catch_up(
        self, first: ViewRead[R], more: Callable[[int, int], ViewRead[R]]
    ) -> tuple[int, int]:
        """A round: the heartbeat's page, then, until caught up, `more(cursor, expired_at)`
        (the next page of changes from the cursor and of expired leases from that offset, a
        bounded READ_PAGE call). Returns the reports read and the calls it took."""
        complete = self.start(first)
        page = first.page
        expired = len(page.expired) if page else 0
        read, calls = len(first.leases) + len(first.gone), 1
        for _ in range(MAX_PAGES):
            if complete and not (page and page.more):
                return read, calls
            after = more(self.cursor, expired)
            self.add(after)
            page, complete = after.page, True
            expired += len(page.expired) if page else 0
            read += len(after.leases) + len(after.gone)
            calls += 1
        log.warning("the leases did not fit in %d pages: planning from what was read", MAX_PAGES)
        return read, calls

    @property
    def next_deadline_ms(self) -> int | None:
        """The earliest live lease deadline, as the last page read gave it."""
        return self._next_deadline

    def forget(self, names: Iterable[str]) -> None:
        """Leases the leader removed (reaped, or dropped as garbage)."""
        for name in names:
            self._leases.pop(name, None)
            self._fresh.pop(name, None)

    def leases(self, now_ms: int) -> tuple[Lease[R], ...]:
        """Every lease known, each with a deadline no later than its real one (module doc). A
        lease not read again keeps the deadline it has while that is still ahead of `now_ms`,
        so each is rebuilt about once per lease_ttl, not at every heartbeat."""
        floor = self._next_deadline
        found = []
        for name, lease in self._leases.items():
            if name in self._fresh:
                found.append(lease)
            elif floor is None:  # no lease is live, and this one was not among the expired:
                continue  # it holds none
            elif lease.deadline_ms > now_ms:
                found.append(lease)
            else:  # not expired, so live: at least the earliest live deadline
                lease = self._leases[name] = Lease(name, floor, lease.report)
                found.append(lease)
        return tuple(found)

    def __len__(self) -> int:
        return len(self._leases)


def sweep_all(read: Callable[[str], ViewRead[R]]) -> tuple[Lease[R], ...]:
    """Every lease, for a reader that keeps no view (status, `nodeagentctl nodes`): a ZSCAN in
    pages, `read(sweep)` from each cursor; each lease as its page read it."""
    found: dict[str, Lease[R]] = {}
    sweep = "0"
    for _ in range(MAX_PAGES):
        page = read(sweep)
        found.update((lease.name, lease) for lease in page.leases)
        sweep = page.page.sweep if page.page else "0"
        if sweep == "0":
            break
    return tuple(found.values())


def parse_page(reply: Sequence[Any], check: Callable[[str, str], int | None]) -> ViewPage | None:
    """The ViewPage of a SYNC (leader) or READ_PAGE reply (scripts.py); `check` gives an
    expired lease's deadline, or None when it is garbage (the caller notes and drops it)."""
    if len(reply) < 17:
        return None
    expired = []
    flat = reply[14]
    for i in range(0, len(flat) - 1, 2):
        name, score = as_text(flat[i]), as_text(flat[i + 1])
        deadline = check(name, score)
        if deadline is not None:
            expired.append((name, deadline))
    return ViewPage(
        seq=parse_uint(reply[11]) or 0,
        reached=parse_uint(reply[12]) or 0,
        more=bool(reply[13]),
        expired=tuple(expired),
        next_deadline_ms=_deadline(reply[15]),
        sweep=as_text(reply[16]) if reply[16] else "0",
    )


def _deadline(raw: Any) -> int | None:
    try:
        value = float(as_text(raw)) if raw else math.nan
    except ValueError:
        return None
    return int(value) if math.isfinite(value) and 0 <= value <= MAX_INT else None


def as_text(value: Any) -> str:
    """A value of a reply as text (bytes that are not UTF-8 replaced, never an error)."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
