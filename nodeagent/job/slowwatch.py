"""The leader's slow-node watch: once a window, read every node's speed, judge (job/slowness.py),
write the verdicts and carry out the policy's drain. One read of the speed hash a window (about
150 bytes a node: 1.5 MB at 10,000 nodes, every 10 s by default).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from nodeagent.config.settings import Config
from nodeagent.coord.bounded import CallRunner
from nodeagent.errors import CoordinationError, FencedError
from nodeagent.job.port import JobPort
from nodeagent.job.slowness import SlowMemory, SlowPolicy, judge
from nodeagent.model.job import Event, JobRecord, NodeReport
from nodeagent.telemetry.metrics import AgentMetrics

log = logging.getLogger(__name__)


def slow_policy(config: Config) -> SlowPolicy:
    settings = config.job.slow_node
    return SlowPolicy(settings.policy, settings.threshold, settings.windows, settings.window)


class SlowWatch:
    def __init__(
        self,
        store: JobPort,
        policy: SlowPolicy,
        metrics: AgentMetrics,
        clock: Callable[[], float],
        call: CallRunner,
    ) -> None:
        self._store = store
        self._policy = policy
        self._metrics = metrics
        self._clock = clock
        self._call = call
        self._memory: SlowMemory | None = None  # None: not leading (the verdicts not read)
        self._next = 0.0

    def tick(
        self,
        token: str,
        record: JobRecord | None,
        live: Callable[[], Mapping[str, NodeReport]],
        now_ms: int,
    ) -> list[Event]:
        """The window's events, when a window is due; else none. `live`: the reports of the
        nodes whose lease holds (built only when a window is due)."""
        now = self._clock()
        if not self._policy.enabled or now < self._next:
            return []
        window = self._policy.window_s
        # On a grid of windows from the first judgment (not from when each ran: that drifted
        # a heartbeat a window), unless the leader fell a whole window behind.
        self._next = self._next + window if now - self._next < window else now + window
        try:
            speeds = self._call(self._store.speeds, "read the speeds")
            if self._memory is None:  # a new term: what the last leader named stays named
                named = self._call(self._store.slow_verdicts, "read the slow verdicts")
                self._memory = SlowMemory(named=named)
        except CoordinationError as exc:
            log.info("cannot read the job's speeds: %s", exc)
            return []
        nodes = live()
        found = judge(speeds, nodes, record, self._policy, self._memory, now_ms)
        gone_nodes = [name for name in speeds if name not in nodes]  # their leases lapsed
        try:
            if found.put or found.gone or gone_nodes:
                self._call(
                    lambda: self._store.write_verdicts(token, found.put, found.gone, gone_nodes),
                    "write the slow verdicts",
                )
            if found.drain is not None:
                name, cordon = found.drain
                log.warning("draining %s: %s", name, cordon.reason)
                self._call(lambda: self._store.cordon(name, cordon), "drain a slow node")
        except FencedError:
            self.stepped_down()
            return []
        except CoordinationError as exc:  # judged again next window, from what was written
            log.info("cannot write the slow verdicts: %s", exc)
            self._memory = None
            return []
        self._memory = found.memory
        self._metrics.slow({n: v.ratio for n, v in found.memory.named.items()})
        return list(found.events)

    def next_due(self) -> float | None:
        """When the leader judges next (it wakes for it); None: the watch is off."""
        return self._next if self._policy.enabled else None

    def stepped_down(self) -> None:
        if self._memory is not None:
            self._memory = None
            self._metrics.slow(None)
