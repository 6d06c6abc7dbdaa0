"""In-place recovery (job.recovery: in_place): a group released rather than stopped.

`Supervisor.release()` tells every worker over its control channel (nodeagent.channel.control)
to leave its generation's process group; the group is PARKED once every live worker has reported
leaving, and the next `start()` hands survivors their new ranks and spawns only the local ranks
with no survivor. A survivor that has not left by the release deadline is killed, and its local
rank is spawned anew.

Warm-ups (`warm_ups`, in place): while the group is released, a local rank whose worker failed
and has no preloaded spare gets its replacement at once, outside any generation: a worker of the
old generation's environment told, before it starts, to leave that generation. It imports and
sets up while the job goes on without this node, reaches `elastic.run`, and parks like a
survivor; the status counts it as warming until then (the leader does not wait for a warming
node: job/plan.py), and the next `start()` hands it its rank as it does a survivor's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from nodeagent.channel.control import ControlFileError
from nodeagent.model.job import Failure
from nodeagent.supervisor.worker import Worker, live, unleft

log = logging.getLogger(__name__)
RELEASE_POLL_S = 0.002  # how often a release's watcher reads the workers' channels
# Failures (Supervisor.mark_failed) of a worker that will not leave its group when told to.
STUCK = frozenset({"hang", "xid"})


@dataclass
class Release:
    """One release of a group: its workers told to leave their generation by `deadline`
    (`timeout` after the release began); the local ranks given a warm-up since."""

    deadline: float
    timeout: float
    warmed: set[int] = field(default_factory=set)

    def tell(self, workers: Sequence[Worker], failure: Failure | None) -> None:
        """Tell every in_place worker to leave its generation's process group (they keep
        running); kill at once the rank of a hang or an XID (it would not leave) and a worker
        whose channel cannot be written."""
        culprit = failure.rank if failure and failure.kind in STUCK else None
        for worker in workers:
            if worker.returncode is None and worker.spec.rank == culprit:
                worker.abandoned = True  # hung, or its GPU failed: it would not leave
                worker.kill()
            elif worker.channel is not None and worker.returncode is None:
                try:
                    worker.channel.leave(worker.generation)
                except (ControlFileError, ValueError) as exc:
                    log.warning(
                        "rank %d: cannot write its channel (%s): killing it", worker.spec.rank, exc
                    )
                    worker.kill()

    def to_warm(
        self, workers: Sequence[Worker], now: float, failure: Failure | None
    ) -> list[Worker]:
        """The failed workers whose local ranks get a warm-up (the module docstring) now, each
        rank once a release (marked in `warmed`): none once the deadline has passed (a survivor
        that gave up waiting: the next start's), none after an XID (its GPU: cordoned), none
        for a rank with a live worker, nor for a warm-up that failed itself (its rank starts
        in the next generation as any other, cold, and fails there if it must)."""
        if now >= self.deadline:
            return []
        if failure is not None and failure.kind == "xid":
            return []
        busy = {w.spec.local_rank for w in live(workers)}
        dead = []
        for worker in workers:
            rank = worker.spec.local_rank
            failed = worker.returncode not in (None, 0) and not worker.finished
            if not failed or worker.warmup or rank in busy or rank in self.warmed:
                continue
            self.warmed.add(rank)
            dead.append(worker)
        return dead

    def watch(
        self,
        waiting: list[Worker],
        clock: Callable[[], float],
        wake: Callable[[], None],
        name: str,
    ) -> None:
        """In a thread of its own: wake the agent as workers report leaving (a report is a
        write to shared memory, which wakes nobody; an exit does, through the wait for it)."""
        args = (waiting, self.deadline, clock, wake)
        threading.Thread(target=_watch_leaving, args=args, name=name, daemon=True).start()

    def enforce(self, workers: Sequence[Worker], now: float) -> None:
        """Kill each worker still in its old process group past the deadline (blocked in a
        collective with a frozen peer: gloo cannot be aborted), and each warm-up not parked by
        its own; its local rank starts anew."""
        for worker in unleft(workers):
            if worker.abandoned:
                continue
            if worker.warmup and now >= worker.warm_until:
                log.warning(
                    "local rank %d: its warm-up (pid %d) did not reach elastic.run in "
                    "reform_timeout: killing it; the rank starts with the next generation",
                    *(worker.spec.local_rank, worker.pid),
                )
            elif worker.warmup or now < self.deadline:
                continue
            else:
                log.warning(
                    "rank %d (pid %d) did not leave generation %d in reform_timeout: killing it",
                    *(worker.spec.rank, worker.pid, worker.generation),
                )
            worker.abandoned = True
            worker.kill()

    def next_deadline(self, workers: Sequence[Worker]) -> float | None:
        """When a worker that has not left must be killed, if one is waited for (a killed one's
        exit wakes the agent)."""
        waiting = [w for w in unleft(workers) if not w.abandoned]
        if not waiting:
            return None
        return min(w.warm_until if w.warmup else self.deadline for w in waiting)


def _watch_leaving(
    waiting: list[Worker], deadline: float, clock: Callable[[], float], wake: Callable[[], None]
) -> None:
    """Polls the channels every RELEASE_POLL_S until each worker has left or exited, or the
    release deadline has passed; only reads (the agent's loop acts)."""
    while waiting and clock() < deadline:
        time.sleep(RELEASE_POLL_S)
        still = [w for w in waiting if w.returncode is None and not w.has_left()]
        if len(still) < len(waiting):
            wake()
        waiting = still
