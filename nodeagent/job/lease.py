"""This node's lease as the agent sees it on its own clock: when its workers must be fenced
(decision 5), how long a Redis call may take, and what the fence keeper is told.

All times are local monotonic seconds, counted from the moment the last successful renewal was
*sent* (Redis set the deadline no earlier than that). The agent stops its workers at FENCE_AT
of lease_ttl; its fence keeper SIGTERMs them at KEEPER_TERM_AT if the agent did not (it is
frozen or dead; a little later, so a renewal that lands just in time is not raced); both SIGKILL
what is left at KILL_AT, before the lease can lapse on the server.

A member riding through a Redis outage (job/ridethrough.py) may begin its ride from RIDE_AT
without a renewal (before its fence point, so that a loop that runs late still begins it before
the keeper acts); it then counts every tick at which the ride's rule still holds as its keeper
and fence point count a renewal (`ride`), up to the ride's end: a rider that freezes is fenced
by its keeper as a member that froze unridden is, from its last tick. A ride cut short fences
at once, and kills as long after the cut as a fence point allows; cut short because a peer
went unheard, it kills by the lease's own kill point where that is still to come (a node
partitioned from everything, which rode a moment on beats heard just before, is dead before
its lease lapses, as if it had never ridden: its peers, reaching Redis, may count it lost
then). A renewal ends the ride.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from nodeagent.supervisor.fence import Group, JobFence, Keeper

log = logging.getLogger(__name__)
RIDE_AT = 0.4
FENCE_AT = 0.5
KEEPER_TERM_AT = 0.55
KILL_AT = 0.9


class LeaseClock:
    def __init__(
        self,
        lease_ttl: float,
        keeper: Keeper | JobFence | None,
        ride_call_s: float = 0.0,
        rides: bool = False,
    ) -> None:
        """`ride_call_s`: how long a Redis call may keep the loop while it rides through (it
        must hear its peers meanwhile); 0: as long as a call may otherwise. `rides`: a ride
        may begin (timing.ride_through is on): a call returns by RIDE_AT, not the fence
        point."""
        self.lease_ttl = lease_ttl
        self.last_ok_send: float | None = None  # when the last renewal that worked was sent
        self._keeper = keeper
        self.keeper_down = False  # it cannot be started: fence now
        self.rides = rides
        self.ride_until: float | None = None  # a ride's end, while riding or cut short
        self._vouched = 0.0  # its last tick at which the ride's rule held
        self._cut: float | None = None  # when the ride was cut short
        self._unheard = False  # ... because a peer went unheard
        self._ride_call_s = ride_call_s

    def renewed(self, sent_at: float) -> None:
        self.last_ok_send = sent_at
        self.ride_until, self._cut, self._unheard = None, None, False

    @property
    def riding(self) -> bool:
        return self.ride_until is not None and self._cut is None

    def ride(self, until: float, now: float) -> None:
        """Go on until `until`, the ride's end: its rule held at `now`."""
        self.ride_until, self._vouched = until, now

    def cut(self, now: float, unheard: bool = False) -> None:
        """The ride ends now: fence now, at or short of its end (`unheard`: because a peer
        went unheard; the module docstring)."""
        if self.riding:
            self._cut, self._unheard = now, unheard

    def may_ride(self, now: float) -> bool:
        """A ride may begin (from RIDE_AT without a renewal, and before the keeper acts on the
        lease's own times) or go on (the keeper has not acted on what it was last told)."""
        told = self._keeper.term_at if self._keeper is not None else None
        waits = not self.keeper_down and (told is None or now < told)
        if self.riding or self._cut is not None:
            return self.riding and waits
        last = self.last_ok_send
        if not self.rides or last is None:
            return False
        return last + self.lease_ttl * RIDE_AT <= now < last + self.lease_ttl * KEEPER_TERM_AT and (
            waits
        )

    def _at(self, fraction: float) -> float | None:
        last = self.last_ok_send
        if last is None:
            return None
        own = last + self.lease_ttl * fraction
        end = self.ride_until
        if end is None:
            return own
        past = self.lease_ttl * (fraction - FENCE_AT)  # how far past a fence point
        riding = min(self._vouched + self.lease_ttl * fraction, end + past)
        cut = self._cut
        if cut is None:
            return riding
        if self._unheard and cut < last + self.lease_ttl * KILL_AT:  # by the lease's own
            return min(riding, own)
        return min(riding, cut + past)

    @property
    def fence_point(self) -> float | None:
        return self._at(FENCE_AT)

    @property
    def kill_at(self) -> float | None:
        return self._at(KILL_AT)

    def call_deadline(self, now: float, workers_on_lease: bool) -> float:
        """A Redis call returns (or fails) by the fence point (by RIDE_AT, where rides may
        begin) while this node's workers run on its lease, and within half a lease otherwise.
        (A pending SIGKILL at the end of a stop's grace may wait for the call: a late one
        delays a re-form, never safety, which the fence point and the keeper hold.)"""
        deadline = now + self.lease_ttl * FENCE_AT
        point = self.critical_at
        if point is not None and workers_on_lease:
            deadline = min(deadline, point)
        if self.riding and self._ride_call_s > 0:
            deadline = min(deadline, now + self._ride_call_s)
        return deadline

    @property
    def critical_at(self) -> float | None:
        """The next moment the loop must look at its lease: where a ride may begin, or the
        fence point (riding, the next tick must come within `ride_call_s`)."""
        last = self.last_ok_send
        if self.rides and not self.riding and self._cut is None and last is not None:
            return last + self.lease_ttl * RIDE_AT
        return self.fence_point

    def fence_due(self, now: float) -> bool:
        """Stop workers before the lease can expire: no renewal for half the lease, the fence
        keeper about to act on what it was last told, or no keeper that can run."""
        point = self.fence_point
        if point is None:
            return False
        if now >= point or self.keeper_down:
            return True
        keeper_term = self._keeper.term_at if self._keeper is not None else None
        return keeper_term is not None and now >= keeper_term

    def guard(self, groups: Sequence[Group]) -> bool:
        """Keep the fence keeper alive and told when to fence `groups`. False when it is down
        and cannot be started (the agent must fence now)."""
        keeper = self._keeper
        if keeper is None:
            return True
        if not keeper.alive():
            log.error("fence keeper exited (%s); restarting it", keeper.exit_status())
            try:
                keeper.start()
                self.keeper_down = False
            except OSError as exc:
                if not self.keeper_down:
                    log.error("cannot start the fence keeper: %s; fencing", exc)
                self.keeper_down = True
                return False
        keeper.update(self._at(KEEPER_TERM_AT), self._at(KILL_AT), groups)
        return True
