"""The agent's own departure from its job: a stop asked (flags only, safe from a signal handler)
and forced by a second ask; a single-job agent's stop once its job has ended (job/outcome.py,
its exit code kept); the wait, shutting down, for the leader's announcement of the generation
that goes on without this node, so that it hands its stop save over first; and the LEAVE that
gives its lease up at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from nodeagent.config.settings import Config
from nodeagent.coord.bounded import CallRunner
from nodeagent.errors import CoordinationError
from nodeagent.job import outcome
from nodeagent.job.port import JobPort
from nodeagent.model.job import Event, JobRecord
from nodeagent.state import JobState
from nodeagent.supervisor.status import GroupStatus

log = logging.getLogger(__name__)


class Leaving:
    def __init__(
        self,
        config: Config,
        store: JobPort,
        call: CallRunner,
        clock: Callable[[], float],
        until_done: bool,
    ) -> None:
        """`until_done`: serve this one job and leave when it ends (`nodeagent launch`, an
        embedded Redis); `outcome` is then its exit code."""
        self._name, self._store, self._call, self._clock = config.node.name, store, call, clock
        self._lease_ttl = config.timing.lease_ttl
        self._single = outcome.SingleJob(config.job.id) if until_done else None
        self.asked = False  # a stop was asked: stop the workers gracefully and leave
        self.forced = False  # asked again: kill the workers now
        self.began: float | None = None  # when a tick first saw the ask
        self.left = False
        self.outcome: int | None = None  # the job's exit code, once a single job ended

    def ask(self) -> None:
        """First call: stop workers gracefully and leave. Second call: kill workers now."""
        if self.asked:
            self.forced = True
        self.asked = True

    def tick(self, now: float) -> None:
        if self.asked and self.began is None:
            self.began = now

    @property
    def ends_daemon(self) -> bool:
        """This job's end is the daemon's (`nodeagent launch`), and it is stopping."""
        return self.asked and self._single is not None

    def observe(self, record: JobRecord | None) -> None:
        """A single job that has ended: its exit code kept, and a stop asked."""
        if self._single is None or self.asked:
            return
        ending = self._single.observe(record)
        if ending is None:
            return
        self.outcome = ending.code
        log.log(logging.ERROR if ending.error else logging.INFO, "%s", ending.message)
        self.ask()

    def awaiting_announcement(
        self, record: JobRecord | None, group: GroupStatus, hands_over: bool
    ) -> bool:
        """Shutting down, this node hands its stop save over (`hands_over`) once the leader
        announces the generation it leaves; its workers may stop before that announcement comes
        (the leader makes it at its next round after reading this node LEAVING). Until it
        comes, or for a lease at most (no leader to announce: the whole job stopping), the node
        stays."""
        began = self.began
        if not self.asked or began is None or record is None or group.active:
            return False
        if not hands_over:
            return False
        if record.state is not JobState.RUNNING or self._name not in record.members:
            return False
        return self._clock() - began < self._lease_ttl

    def leave(self) -> None:
        """Give this node's lease up (LEAVE); one that cannot be removed expires."""
        try:
            event = Event("node_left", node=self._name, message="agent stopped")
            self._call(lambda: self._store.leave(self._name, event), "leave")
        except CoordinationError as exc:
            log.warning("could not remove the lease (%s); it will expire", exc)
        self.left = True
