"""The record rebuilt from what the members run, when Redis lost it. Pure.

A Redis restarted without persistence comes back empty, and a replica promoted by a failover
may lack the last writes (replication is asynchronous): the job's record is then missing, or
older than the generation its members' workers run. The members rode through the outage
(job/ridethrough.py) and are training that generation; planning from what Redis holds would
re-form them all, a restart for nothing. A member's report says what it runs: its workers'
generation, its group rank in it and how many members it has, and the rank-0 member's says
where its master listens (its address and the port it offered, which it keeps until it
acknowledges another generation). When the live reports of the newest running generation name
every rank of it, the leader writes that generation back, RUNNING, as it was: the job goes on,
its workers untouched. While some ranks are missing it waits for their members to come back
from their rides, at most a ride-through; then it plans from what Redis holds, as before (a
new generation above every one reported: numbers are never reused).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from nodeagent.model.job import JobRecord, NodeReport
from nodeagent.state import JobState, NodeState


@dataclass(frozen=True)
class Running:
    """The newest generation the live reports run: its members in rank order (None where no
    live report holds the rank), and its rank-0 member's report if live."""

    generation: int
    members: tuple[str | None, ...]
    master: NodeReport | None

    @property
    def whole(self) -> bool:
        return all(m is not None for m in self.members)

    @property
    def missing(self) -> int:
        return sum(1 for m in self.members if m is None)


def running(nodes: Mapping[str, NodeReport]) -> Running | None:
    """What the live reports say runs now: the newest generation whose workers some member runs,
    or None (none, or reports that contradict each other on its size or ranks)."""
    reports = [
        r
        for r in nodes.values()
        if r.state is NodeState.RUNNING
        and r.worker_generation is not None
        and r.group_rank is not None
        and r.group_size > 0
    ]
    if not reports:
        return None
    newest = max(r.worker_generation or 0 for r in reports)
    of_it = [r for r in reports if r.worker_generation == newest]
    sizes = {r.group_size for r in of_it}
    if len(sizes) != 1:
        return None
    members: list[str | None] = [None] * sizes.pop()
    for report in of_it:
        rank = report.group_rank
        if rank is None or rank >= len(members) or members[rank] is not None:
            return None
        members[rank] = report.name
    first = members[0]
    return Running(newest, tuple(members), nodes[first] if first is not None else None)


def lost(stored: JobRecord | None, now: Running | None) -> bool:
    """Redis lost the record of what runs: it holds none, an older generation, or that one
    not yet RUNNING (a generation is announced RESTARTING and never goes back to it)."""
    if now is None:
        return False
    if stored is None or stored.generation < now.generation:
        return True
    return stored.generation == now.generation and stored.state in (
        JobState.RESTARTING,
        JobState.WAITING,
    )


def rebuilt(
    base: JobRecord, now: Running, nodes: Mapping[str, NodeReport], now_ms: int
) -> JobRecord:
    """`now`'s generation RUNNING again on `base` (the record Redis holds, or a fresh one):
    its members, master and restart count from the reports."""
    assert now.whole and now.master is not None
    members = tuple(m for m in now.members if m is not None)
    return replace(
        base,
        generation=now.generation,
        state=JobState.RUNNING,
        reason="resumed",
        detail="the record was lost by Redis; rebuilt from what its members run",
        restart_count=max([base.restart_count, *(nodes[m].restart_count for m in members)]),
        members=members,
        master_addr=now.master.address,
        master_port=now.master.free_port,
        since_ms=now_ms,
        pending_failure=None,
        waited_on=(),
    )
