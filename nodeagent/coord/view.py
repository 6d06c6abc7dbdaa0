"""The leader's kept view of a job's leases: read once, then only what changed. Pure.

A leader used to read every node's report at every heartbeat: one Lua call that grew with the
fleet (226 ms at 10,000 nodes, during which Redis serves no one else). Now each heartbeat reads
a page (scripts.READ_VIEW): the nodes whose report changed since the leader's cursor, a slice
of a slow sweep over every lease, and the expired leases, which stay exact (the sorted set by
deadline). This view folds the pages into what the leader plans from.

What it knows of a lease it did not read this round: the deadline it read then, which has only
grown since, and, since the lease is not among the expired, one no earlier than the earliest
live deadline. So `leases()` gives each the larger of the two: a lower bound of its deadline
that is later than now, exact for the leases read this round and for every expired one.

The view starts over (everything read again, in pages) when the leader's token changes (a new
term: the change set may have moved while another node led) and when the change counter is
below the cursor. A change set lost and rebuilt restarts its counter from the server time, above
the cursor, so the leader reads each node as it marks itself again and keeps the others.
"""

from __future__ import annotations

from collections.abc import Iterable

from nodeagent.coord.replies import NodeLease, Snapshot

PAGE = 500  # nodes read per call: about a millisecond of Redis time
SWEEP = 100  # leases swept per heartbeat: each one read again every M / SWEEP heartbeats


class LeaderView:
    def __init__(self) -> None:
        self.token: str | None = None
        self.cursor = 0
        self.sweep = "0"
        self._leases: dict[str, NodeLease] = {}
        self._fresh: dict[str, NodeLease] = {}  # read this round, and every expired lease
        self._next_deadline: int | None = None

    def start(self, snapshot: Snapshot) -> bool:
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

    def add(self, snapshot: Snapshot, keep_cursor: bool = True) -> None:
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
        for lease in page.expired:
            known = self._leases.get(lease.name)
            kept = NodeLease(lease.name, lease.deadline_ms, known.report if known else None)
            self._leases[lease.name] = self._fresh[lease.name] = kept
        self._next_deadline = page.next_deadline_ms
        if keep_cursor:
            self.cursor = max(self.cursor, page.reached)
            if page.sweep:
                self.sweep = page.sweep

    def forget(self, names: Iterable[str]) -> None:
        """Leases the leader removed (reaped, or dropped as garbage)."""
        for name in names:
            self._leases.pop(name, None)
            self._fresh.pop(name, None)

    def leases(self, now_ms: int) -> tuple[NodeLease, ...]:
        """Every lease known, each with a deadline no later than its real one (module doc)."""
        floor = self._next_deadline if self._next_deadline is not None else None
        found = []
        for name, lease in self._leases.items():
            if name in self._fresh:
                found.append(lease)
            elif floor is not None:  # not expired, so live: at least the earliest live deadline
                deadline = max(lease.deadline_ms, floor)
                found.append(lease if deadline == lease.deadline_ms else _at(lease, deadline))
            # else no lease is live, and this one was not among the expired: it holds none
        return tuple(found)

    def __len__(self) -> int:
        return len(self._leases)


def _at(lease: NodeLease, deadline_ms: int) -> NodeLease:
    return NodeLease(lease.name, deadline_ms, lease.report)
