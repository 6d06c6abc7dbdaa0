"""This node's lease as the agent sees it on its own clock: when its workers must be fenced
(decision 5), how long a Redis call may take, and what the fence keeper is told.

All times are local monotonic seconds, counted from the moment the last successful renewal was
*sent* (Redis set the deadline no earlier than that). The agent stops its workers at FENCE_AT
of lease_ttl; its fence keeper SIGTERMs them at KEEPER_TERM_AT if the agent did not (it is
frozen or dead; a little later, so a renewal that lands just in time is not raced); both SIGKILL
what is left at KILL_AT, before the lease can lapse on the server.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from nodeagent.supervisor.fence import Group, JobFence, Keeper

log = logging.getLogger(__name__)
FENCE_AT = 0.5
KEEPER_TERM_AT = 0.55
KILL_AT = 0.9


class LeaseClock:
    def __init__(self, lease_ttl: float, keeper: Keeper | JobFence | None) -> None:
        self.lease_ttl = lease_ttl
        self.last_ok_send: float | None = None  # when the last renewal that worked was sent
        self._keeper = keeper
        self.keeper_down = False  # it cannot be started: fence now

    def renewed(self, sent_at: float) -> None:
        self.last_ok_send = sent_at

    def _at(self, fraction: float) -> float | None:
        last = self.last_ok_send
        return None if last is None else last + self.lease_ttl * fraction

    @property
    def fence_point(self) -> float | None:
        return self._at(FENCE_AT)

    @property
    def kill_at(self) -> float | None:
        return self._at(KILL_AT)

    def call_deadline(self, now: float, workers_on_lease: bool) -> float:
        """A Redis call returns (or fails) by the fence point while this node's workers run on
        its lease, and within half a lease otherwise. (A pending SIGKILL at the end of a stop's
        grace may wait for the call: a late one delays a re-form, never safety, which the fence
        point and the keeper hold.)"""
        deadline = now + self.lease_ttl * FENCE_AT
        point = self.fence_point
        if point is not None and workers_on_lease:
            deadline = min(deadline, point)
        return deadline

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
