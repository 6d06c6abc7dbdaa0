"""What the agent does about what its own watches find: a hung rank or one hit by an application
XID failed, this node cordoned (and drained) on a node-level GPU fault and its GPU cordon lifted
once the condition clears (job/watch.py's findings, gpu/policy.py), and its ranks' pace written
once a window for the leader's slow-node watch (job/speed.py). It holds this node's cordon as
the job last said it (the agent's sync) or as it set it itself.
"""

from __future__ import annotations

import logging

from nodeagent.config.settings import Config
from nodeagent.coord.bounded import CallRunner
from nodeagent.errors import CoordinationError
from nodeagent.gpu.health import NodeHealth
from nodeagent.job.port import JobPort, WorkerGroup
from nodeagent.job.speed import SpeedWatch
from nodeagent.job.watch import Findings, WorkerWatch
from nodeagent.model.job import Cordon, JobRecord
from nodeagent.model.stalls import RankStall
from nodeagent.state import JobState
from nodeagent.telemetry.metrics import AgentMetrics

log = logging.getLogger(__name__)


class WatchDuties:
    def __init__(
        self,
        config: Config,
        health: NodeHealth | None,
        store: JobPort,
        metrics: AgentMetrics,
        call: CallRunner,
    ) -> None:
        self._name = config.node.name
        timing = config.timing
        # A rank that waits on its peers is given this much more than hang_timeout (job/watch.py):
        # the node of the rank it waits for reports that one failed at its next heartbeat, and
        # the leader's new generation reaches this node at this one's next.
        grace = 2 * timing.heartbeat_interval + 1.0
        self.watchers = WorkerWatch(
            self._name, timing.hang_timeout, health, timing.stopped_timeout, grace,
            timing.waited_phi,
        )  # fmt: skip
        window = config.job.slow_node.window
        self._speed = SpeedWatch(self._name, window) if window > 0 else None
        self._store, self._metrics, self._call = store, metrics, call
        self.cordon: Cordon | None = None

    @property
    def drained_from_job(self) -> Cordon | None:
        """This node's cordon in the job when it drains it (an operator's, the slow-node
        policy's): the job goes on without this node."""
        return self.cordon if self.cordon is not None and self.cordon.drain else None

    def synced(self, cordon: Cordon | None) -> None:
        """The cordon the job holds for this node, as the agent's sync read it."""
        if self.cordon is not None and cordon is None:
            self.watchers.uncordoned(self.cordon)
        self.cordon = cordon

    def check(self, now: float, workers: WorkerGroup) -> Findings:
        """Execute what the watch found: fail a hung rank or one hit by an application XID,
        cordon (and drain) on a node-level GPU fault, lift a GPU cordon (gpu/policy.py)."""
        found = self.watchers.check(
            now,
            workers.status(),
            self.cordon,
            workers.dump_stacks,
            workers.stopped,
            workers.activity,
            workers.cpu_seconds,
        )
        for kind, seconds in found.detected:
            self._metrics.detected(kind, seconds)
        if found.relisted:
            log.info("ranks silent past their step times: %s", _said(self.watchers.stalls))
        self._fail(found, workers)
        try:
            if found.cordon is not None:
                log.warning("cordoning this node: %s", found.cordon.reason)
                cordon = found.cordon
                self._call(lambda: self._store.cordon(self._name, cordon), "cordon")
                self.cordon = found.cordon
            if found.uncordon:
                log.info("GPU condition cleared: lifting this node's cordon")
                by = "gpu (auto_uncordon)"
                self._call(lambda: self._store.uncordon(self._name, by), "uncordon")
                self.cordon = None
        except CoordinationError as exc:
            log.warning("cannot update this node's cordon now: %s", exc)
        return found

    def named(self, record: JobRecord | None, workers: WorkerGroup) -> Findings | None:
        """The job's leader named a rank of this node, in the generation its workers run, as
        the one every other rank waits on: failed now as hung (job/stalls.py)."""
        group = workers.status()
        if record is None or record.state is not JobState.RUNNING:
            return None
        ranks = [w.local_rank for w in record.waited_on if w.node == self._name]
        if not ranks or record.generation != group.generation:
            return None
        found = self.watchers.named(group, ranks[0], workers.dump_stacks)
        self._fail(found, workers)
        return found

    def _fail(self, found: Findings, workers: WorkerGroup) -> None:
        if found.fail is not None:
            log.warning("local rank %d failed: %s", found.fail.local_rank, found.fail.message)
            workers.mark_failed(found.fail.local_rank, found.fail.kind, found.fail.code)
            self._metrics.worker_failed(found.fail.kind)

    def measure(self, now: float, workers: WorkerGroup) -> None:
        """Once a window: this node's ranks' pace, for the leader's slow-node watch."""
        if self._speed is None:
            return
        speed = self._speed.tick(
            now, workers.status(), self.watchers.last_progress(), workers.workers()
        )
        if speed is None:
            return
        self._metrics.node_work(
            {
                "step": speed.step_s,
                "busy": speed.busy_s,
                "cpu": speed.cpu_s,
                "delay": speed.delay_s,
                "compute": speed.compute_s,
            }
        )
        try:
            self._call(lambda: self._store.put_speed(speed), "write this node's speed")
        except CoordinationError as exc:  # the next window says it again
            log.info("cannot write this node's speed: %s", exc)

    def next_due(self) -> float | None:
        """When a rank may have hung, or this node's speed window ends."""
        due = [self.watchers.next_check(), self._speed.next_due() if self._speed else None]
        return min((at for at in due if at is not None), default=None)


def _said(listed: tuple[RankStall, ...]) -> str:
    if not listed:
        return "none"
    return ", ".join(
        f"local rank {s.local_rank} at step {s.step} ({'waiting' if s.waiting else 'its own work'}"
        f", {'asleep' if s.asleep else 'busy'})"
        for s in listed
    )
