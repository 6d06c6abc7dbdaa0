"""Riding through a coordination outage, and the fencing invariant it must keep. Pure.

**The invariant: never two generations of one job training at once.** A worker of generation g
trains only while its node's agent may still count itself a member of g; the leader starts
generation g+1 only once every member of g has stopped its workers or certainly will have.
Without Redis a node cannot renew its lease, so until now it fenced itself at half the lease
(job/lease.py) and every job in the pool restarted on every Redis failover.

**What lets a member go on.** A re-form needs Redis: only the leader writes a new generation,
in a fenced COMMIT. A member that cannot reach Redis but still hears every other member it
watches (job/peerwatch.py: beats over TCP, Redis not in the path), each saying that its
workers run generation g as this node's do, keeps training past its fence point (`ride`): for
`timing.ride_through` from its last renewal at the most (the record's `ride_through_ms`, never
more than its own setting). It fences itself as before the moment any of that stops holding:
a peer unheard or suspected, a peer whose workers stop or run another generation, its own
workers no longer running, the ride's end. Its fence keeper is told the ride's end in its
place of the lease's (a frozen agent is still fenced: by the keeper, at the ride's end).

**What keeps the leader from re-forming around it.** The rider's lease lapses in Redis while
it rides. A leader counts a lapsed member of the running generation as lost only on evidence
that it is not training (`awaited`): a live member suspects it (its agent is silent or gone:
job/suspicion.py, the same evidence that holds out a node whose lease still holds, with the
same allowance: a member held out alive may run on until it hears of the new generation, in
no group with it), a live member heard its beats say its workers of that generation ended
(`NodeReport.peers_out`: sticky, so a stale report is still true), or the longest ride it
could take is over (its lease deadline plus the ride-through). Until then the member is
awaited as if its lease held: not reaped, not lost, and a new generation waits for it as for
any live member's acknowledgement. A member that reconnects renews its lease, and the job
goes on in the same generation with the same workers.

Beats carry 16 bits of the sender's generation (the wire of job/peerwatch.py, kept readable by
older agents): generations are compared within 32,768 of the reader's own (`widen`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum

from nodeagent.model.job import JobRecord, NodeReport
from nodeagent.state import JobState
from nodeagent.supervisor.status import GroupPhase, GroupStatus

GENERATION_BITS = 16
# A peer is heard, for a ride, while its last beat is at most this many beat intervals old:
# the accrual detector's floor (job/accrual.py). A partition of this node shows only as its
# peers' silence; a ride must end before its lease's kill point would have come.
FRESH_BEATS = 5


class Said(IntEnum):
    """What a node's beat says of its workers, in one byte (job/peerwatch.py).

    UNKNOWN   an agent that says nothing of them (an older one): never ridden with.
    IDLE      it acknowledged the generation its beat names and started no worker of it.
    RUNNING   its workers of that generation run, and it reaches Redis (or is before its fence
              point).
    RIDING    its workers of that generation run past its fence point: it cannot reach Redis.
    STOPPING  its workers of that generation are being stopped or leave their group.
    OUT       its workers of that generation ended (exited, killed, or left their group).
    """

    UNKNOWN = 0
    IDLE = 1
    RUNNING = 2
    RIDING = 3
    STOPPING = 4
    OUT = 5


TRAINING = frozenset({Said.RUNNING, Said.RIDING})


@dataclass(frozen=True)
class Beat:
    """What one peer's last beat said: its workers' state and generation (widened)."""

    said: Said
    generation: int


def says(group: GroupStatus, acked: int, riding: bool) -> Beat:
    """What this node's beats say: its workers' state in their generation, or, none running,
    whether those of the newest generation it acknowledged ended or never started."""
    generation = group.generation
    if generation is not None and group.active:
        if group.phase is GroupPhase.RUNNING:
            return Beat(Said.RIDING if riding else Said.RUNNING, generation)
        return Beat(Said.STOPPING, generation)
    if generation is not None and generation >= acked:
        return Beat(Said.OUT, generation)
    return Beat(Said.IDLE, acked)


def narrow(generation: int) -> int:
    """The bits of a generation a beat carries."""
    return generation & ((1 << GENERATION_BITS) - 1)


def widen(bits: int, near: int) -> int:
    """The generation nearest `near` whose low bits are `bits` (a beat's, widened by its
    reader around the generation it knows)."""
    span = 1 << GENERATION_BITS
    return near + ((bits - near + span // 2) % span) - span // 2


@dataclass(frozen=True)
class RideView:
    """What a member knows when its lease is past its fence point (local seconds)."""

    me: str
    now: float
    renewed_at: float  # when its last renewal that worked was sent
    ride_through: float  # its own timing.ride_through (0: off)
    record: JobRecord | None  # as last read
    group: GroupStatus
    watched: tuple[str, ...]  # the members it watches (job/suspicion.watched)
    # those heard lately (FRESH_BEATS) and not suspected: what their last beat said
    heard: Mapping[str, Beat]


@dataclass(frozen=True)
class Ride:
    """Whether to go on training without Redis, until when (local seconds), and why.
    `unheard`: not, because a peer is not heard: this node may be the one cut off, and its
    peers, reaching Redis, may count it lost at its lease (job/lease.py's `cut`)."""

    on: bool
    until: float | None
    reason: str
    unheard: bool = False


def ride_until(renewed_at: float, ride_through: float, record: JobRecord | None) -> float:
    """The ride's end: the shorter of this node's setting and the record's."""
    allowed = record.ride_through_ms / 1000 if record is not None else 0.0
    return renewed_at + min(ride_through, allowed)


def ride(view: RideView) -> Ride:
    """May this member go on training past its fence point? (the module docstring)"""
    record, group = view.record, view.group
    if view.ride_through <= 0 or record is None or record.ride_through_ms <= 0:
        return Ride(False, None, "ride-through is off")
    until = ride_until(view.renewed_at, view.ride_through, record)
    if view.now >= until:
        return Ride(False, None, f"rode through {until - view.renewed_at:g}s: the ride is over")
    generation = record.generation
    if record.state is not JobState.RUNNING or view.me not in record.members:
        return Ride(False, None, f"not a member of a running generation ({record.state.value})")
    if group.phase is not GroupPhase.RUNNING or group.generation != generation:
        return Ride(False, None, f"its workers do not run generation {generation}")
    for peer in view.watched:
        beat = view.heard.get(peer)
        if beat is None:
            return Ride(False, None, f"{peer} is not heard (no beat lately)", unheard=True)
        if beat.said not in TRAINING or beat.generation != generation:
            doing = f"{beat.said.name} in generation {beat.generation}"
            return Ride(False, None, f"{peer}'s workers are {doing}")
    heard = f"every member heard ({len(view.watched)})" if view.watched else "no other member"
    return Ride(True, until, f"{heard} training generation {generation}")


def out_of(reports: Iterable[NodeReport]) -> dict[str, int]:
    """For each peer the live reports heard end its workers: the newest generation it ended."""
    found: dict[str, int] = {}
    for report in reports:
        for name, generation in report.peers_out:
            found[name] = max(generation, found.get(name, -1))
    return found


def awaited(
    record: JobRecord | None,
    lapsed: Mapping[str, int],
    nodes: Mapping[str, NodeReport],
    now_ms: int,
    ride_through_ms: int,
) -> frozenset[str]:
    """The members whose leases lapsed (`lapsed`: name -> deadline, Redis ms) that may still
    be training, riding through: planned as live members, awaited, never reaped or lost yet.

    `ride_through_ms`: the longest ride a member may take (the leader's setting or the
    record's, the longer). The bar is the generation their workers run: the record's while it
    runs, the one before while it restarts."""
    if ride_through_ms <= 0 or record is None or not lapsed:
        return frozenset()
    if record.state is JobState.RUNNING:
        bar = record.generation
    elif record.state is JobState.RESTARTING:
        bar = record.generation - 1
    else:
        return frozenset()
    suspected = {name for report in nodes.values() for name in report.suspects}
    ended = out_of(nodes.values())
    return frozenset(
        name
        for name in record.members
        if name in lapsed
        and now_ms < lapsed[name] + ride_through_ms
        and name not in suspected
        and ended.get(name, -1) < bar
    )
